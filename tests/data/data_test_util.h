// Helpers for the data tests: a per-process temporary folder, raw file bytes, a hand-built
// Megatron .idx (any version, dtype, spans) and random documents from the test seed.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/rng.h"
#include "data/token_dataset.h"

namespace engine::data_testing {

// A fresh, empty folder /tmp/engine_data_tests.<pid>/<name> (the root is removed at exit).
std::string data_test_dir(const std::string& name);

std::vector<unsigned char> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes);

// Little-endian append helpers.
template <typename T>
void append(std::vector<unsigned char>& b, T v) {
  unsigned char tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}

// A Megatron .idx + .bin built by hand from its fields (FORMATS.md order); the defaults follow
// from `docs` (contiguous pointers, doc_idx = 0..N).
struct RawIndex {
  uint64_t version = 1;
  uint8_t dtype_code = 8;  // 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 8 u16
  std::vector<std::vector<int64_t>> docs;
  bool has_spans = false;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> spans;  // inclusive ends, per document
  bool has_preference = false;
  std::vector<std::pair<int32_t, int32_t>> chosen, rejected;    // per document
  std::vector<int64_t> pointers;  // empty: contiguous
  std::vector<int64_t> doc_idx;   // empty: 0..N
};
int dtype_code_size(uint8_t code);
void write_raw_index(const std::string& prefix, const RawIndex& r);

// `count` documents of random lengths in [min_len, max_len] and tokens in [0, vocab).
std::vector<std::vector<int32_t>> random_documents(const std::string& name, int count, int min_len,
                                                   int max_len, int vocab);

// A Config with one dataset per path (weights given or 1), sequence length S and vocabulary.
Config data_config(const std::vector<std::string>& paths, int sequence_length, int vocab_size,
                   bool truncate_documents = true, const std::vector<double>& weights = {});

}  // namespace engine::data_testing
