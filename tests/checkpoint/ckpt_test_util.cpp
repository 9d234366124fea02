#include "tests/checkpoint/ckpt_test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/hf.h"
#include "core/log.h"
#include "tests/common/tiny.h"
#include "tests/train/train_fixture.h"

namespace engine::testing {

std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::path(learnable_dataset()).parent_path() / "ckpt" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void truncate_file(const std::string& path, uint64_t size) { std::filesystem::resize_file(path, size); }

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

void check_mentions(const std::string& message, const std::vector<std::string>& pieces) {
  INFO("message: " << message);
  CHECK(!message.empty());
  for (const auto& p : pieces) {
    INFO("expected to mention: " << p);
    CHECK(message.find(p) != std::string::npos);
  }
}

std::unique_ptr<Model> random_model(const ModelConfig& c, const std::string& name) {
  auto m = make_model(c, Device::CPU, DType::F32);
  randomize_weights(m->params(), name, 0.2);
  return m;
}

checkpoint::Fetch store_fetch(const ParamStore& s) {
  return [&s](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
    std::memcpy(out, s.weight(p.name).ptr<float>() + lo, static_cast<size_t>(hi - lo) * 4);
  };
}

std::string export_random_model(const ModelConfig& c, const std::string& folder, const std::string& name) {
  auto m = random_model(c, name);
  const std::string dir = scratch_dir(folder) + "/" + name;
  hf::export_hf(c, m->params().table(), store_fetch(m->params()), dir);
  return dir;
}

}  // namespace engine::testing
