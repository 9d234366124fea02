// A sharded Hugging Face folder: the input is model.safetensors.index.json, next to a valid
// shard model-00001-of-00001.safetensors holding a tiny Llama's tensors (written once per
// process); HfWeights opens the folder and every parameter is fetched.
#include <string>
#include <vector>

#include "checkpoint/hf.h"
#include "config/config.h"
#include "models/model.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

engine::ModelConfig tiny_llama() {
  engine::ModelConfig c;  // as the llama preset fills it (tests/common/tiny.cpp)
  c.family = engine::ModelFamily::Llama;
  c.vocab_size = 8;
  c.hidden_size = 4;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.ffn_hidden_size = 6;
  c.max_position_embeddings = 4;
  return c;
}

void write_shard(const std::string& dir, const engine::ModelConfig& c) {
  engine::checkpoint::SafetensorsWriter w;
  for (const auto& m : engine::hf::tensor_map(c)) {
    int64_t n = 1;
    for (int64_t x : m.hf_shape) n *= x;
    w.add(m.hf_name, "F32", m.hf_shape, [n](engine::checkpoint::OutFile& out) {
      std::vector<float> v(static_cast<size_t>(n), 0.5f);
      out.write(v.data(), v.size() * sizeof(float));
    });
  }
  w.write(dir + "/model-00001-of-00001.safetensors");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const engine::ModelConfig c = tiny_llama();
  static const std::string dir = [] {
    const std::string d = fuzz::temp_dir() + "/hf";
    std::filesystem::create_directories(d);
    write_shard(d, c);
    return d;
  }();
  fuzz::write_file(dir + "/model.safetensors.index.json", data, size);
  fuzz::expect_ok_or_error([&] {
    engine::hf::HfWeights w(dir, c);
    const engine::ParamTable table = engine::model_param_table(c);
    std::vector<float> out;
    for (const auto& p : table.entries()) {
      out.resize(static_cast<size_t>(p.shape.numel()));
      w.fetch(p, 0, p.shape.numel(), out.data());
    }
  });
  return 0;
}
