// The language-model head on the GPU against the f64 CPU head on the same bf16 values: loss,
// input gradient and weight gradient, for vocabularies that are a multiple of 8 and ones that
// are not (on CUDA those run on a zero-padded weight copy and padded logits, lm_head.cpp), tied
// and untied, with z-loss and label smoothing, and chunked (cross_entropy_splits > 1).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "layers/embedding.h"
#include "layers/lm_head.h"
#include "models/micro_batch.h"
#include "tests/common/gpu_testing.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

TEST_CASE("GPU LM head matches the f64 CPU head, padded (odd) and plain vocabularies" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int vocab;
    bool tied;
    int splits;
    double z_loss, smoothing;
  };
  for (const Case& k : {Case{257, true, 1, 0, 0}, Case{257, false, 3, 1e-3, 0.1}, Case{264, false, 1, 0, 0},
                        Case{1001, true, 2, 0, 0.05}}) {
    const std::string name = "V " + std::to_string(k.vocab) + (k.tied ? " tied" : " untied") + ", splits " +
                             std::to_string(k.splits);
    SUBCASE(name.c_str()) {
      ModelConfig c = tiny_model(ModelFamily::Llama);
      c.vocab_size = k.vocab;
      c.tie_embeddings = k.tied;
      c.z_loss = k.z_loss;
      c.label_smoothing = k.smoothing;
      ParamTable t;
      layers::Embedding::declare(t, c);
      layers::LmHead::declare(t, c);
      ParamStore cpu(t, Device::CPU, DType::F64), gpu(t, Device::CUDA, DType::BF16);
      randomize_weights(cpu, "lm head gpu " + name, 0.3);
      copy_tensor(gpu.weights_flat(), to_host(cpu.weights_flat(), DType::BF16));
      copy_tensor(cpu.weights_flat(), to_host(gpu.weights_flat(), DType::F64));  // rounded
      layers::LmHead hc(cpu, c, k.splits), hg(gpu, c, k.splits);
      Sample s0 = make_sample({40, 30}, c.vocab_size, "head gpu s0"), s1 = make_sample({70}, c.vocab_size, "head gpu s1");
      MicroBatch mc = make_micro_batch({&s0, &s1}, 70, false, Device::CPU);
      MicroBatch mg = make_micro_batch({&s0, &s1}, 70, false, Device::CUDA);
      auto [gx, x64] = device_input(randn({mc.num_tokens, c.hidden_size}, DType::F32, "head gpu x"), DType::BF16);
      const layers::Env cenv{Device::CPU, DType::F64}, genv{Device::CUDA, DType::BF16};
      const float scale = 0.25f;
      cpu.zero_grads();
      gpu.zero_grads();
      layers::HeadSaved sc, sg;
      const double lc = hc.forward(cenv, x64, mc.labels, mc.loss_mask, true, scale, sc);
      const double lg = hg.forward(genv, gx.t, mg.labels, mg.loss_mask, true, scale, sg);
      CHECK(lg == doctest::Approx(lc).epsilon(2e-3));
      CHECK_CLOSE(sg.dx, sc.dx, 2e-2);
      const char* w = k.tied ? layers::Embedding::kTokens : "head.weight";
      CHECK_CLOSE(gpu.grad(w), cpu.grad(w), 2e-2);
      CHECK_CLOSE(gpu.grad("final_norm.weight"), cpu.grad("final_norm.weight"), 2e-2);
    }
  }
}
