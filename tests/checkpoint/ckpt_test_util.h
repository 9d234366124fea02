// Helpers of the checkpoint tests: a scratch folder per test, file mutations (truncate, flip a
// byte, replace), a check that an exception's message holds every expected piece.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"  // checkpoint::Fetch
#include "models/model.h"
#include "tests/common/testing.h"  // error_of

namespace engine::testing {

// A fresh, empty folder under the test temp folder (removed at exit with it).
std::string scratch_dir(const std::string& name);
void truncate_file(const std::string& path, uint64_t size);
void flip_byte(const std::string& path, uint64_t offset);
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
// CHECKs that `message` contains every piece (reported with the message when one is missing).
void check_mentions(const std::string& message, const std::vector<std::string>& pieces);

// A CPU f32 model of `c` with generic weights (norm weights and biases not 1 and 0), named for
// its random stream; the fetch export_hf takes from its store; and a Hugging Face export of such
// a model into scratch_dir(folder)/name.
std::unique_ptr<Model> random_model(const ModelConfig& c, const std::string& name);
checkpoint::Fetch store_fetch(const ParamStore& s);
std::string export_random_model(const ModelConfig& c, const std::string& folder, const std::string& name);

}  // namespace engine::testing
