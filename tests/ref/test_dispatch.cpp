// Device dispatch (ops/op.h): every op refuses tensors on two devices, naming both, and in
// a build without CUDA refuses CUDA tensors with a message. The "CUDA" tensors here are views
// labelled Device::CUDA over host memory; the checks stop before anything reads them.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/qk_norm.h"
#include "ops/rope.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

Tensor on_gpu(const Tensor& t) { return Tensor(t.data, t.dtype, Device::CUDA, t.shape); }

struct OpCall {
  const char* name;
  std::function<void(const Tensor& x)> call;  // x: the (4, 4) f32 argument under test
};

}  // namespace

TEST_CASE("every op refuses tensors on two devices, and CUDA tensors without CUDA") {
  Owned buf = zeros({4, 4}, DType::F32, Device::CPU), row = zeros({4}, DType::F32, Device::CPU);
  Owned ids = zeros({4}, DType::I32, Device::CPU), mask = zeros({4}, DType::U8, Device::CPU);
  const Tensor c = buf.t, r = row.t;
  ops::AttentionParams ap;
  ap.cu_seqlens = ids.t;
  const std::vector<OpCall> calls = {
      {"matmul", [&](const Tensor& x) { ops::matmul(x, false, c, false, c, {}); }},
      {"sum_rows", [&](const Tensor& x) { ops::sum_rows(x, r, 0.f); }},
      {"layernorm_forward",
       [&](const Tensor& x) { ops::layernorm_forward(x, r, r, 1e-5f, c, r, r, {}); }},
      {"layernorm_backward",
       [&](const Tensor& x) { ops::layernorm_backward(x, c, r, r, r, c, r, r); }},
      {"rmsnorm_forward", [&](const Tensor& x) { ops::rmsnorm_forward(x, r, 1e-5f, c, r, {}); }},
      {"rmsnorm_backward", [&](const Tensor& x) { ops::rmsnorm_backward(x, c, r, r, c, r); }},
      {"gelu_forward", [&](const Tensor& x) { ops::gelu_forward(x, c); }},
      {"gelu_backward", [&](const Tensor& x) { ops::gelu_backward(x, c, c); }},
      {"swiglu_forward", [&](const Tensor& x) { ops::swiglu_forward(x, c, {}); }},
      {"swiglu_backward", [&](const Tensor& x) { ops::swiglu_backward(x, c, c, {}); }},
      {"rope_forward", [&](const Tensor& x) { ops::rope_forward(x, ids, 1, ops::RopeParams{}); }},
      {"rope_backward", [&](const Tensor& x) { ops::rope_backward(x, ids, 1, ops::RopeParams{}); }},
      {"qk_norm_forward", [&](const Tensor& x) { ops::qk_norm_forward(x, c, 1, 1e-6f, c, c); }},
      {"qk_norm_backward", [&](const Tensor& x) { ops::qk_norm_backward(x, c, c, 1, c, c); }},
      {"attention_forward",
       [&](const Tensor& x) {
         ops::AttentionParams p = ap;
         p.qkv = x;
         ops::attention_forward(p);
       }},
      {"attention_backward",
       [&](const Tensor& x) {
         ops::attention_backward({ap, x, c});
       }},
      {"embedding_forward",
       [&](const Tensor& x) { ops::embedding_forward(ids, x, c, false, 0, 0, ops::IdCheck::kRaise); }},
      {"embedding_backward",
       [&](const Tensor& x) { ops::embedding_backward(ids, c, x, 0, 0, ops::IdCheck::kRaise); }},
      {"cross_entropy",
       [&](const Tensor& x) { ops::cross_entropy(x, ids, mask, r, false, 1.f, 0.f, 0.f, 0); }},
      {"add", [&](const Tensor& x) { ops::add(x, c, c); }},
      {"add_inplace", [&](const Tensor& x) { ops::add_inplace(x, c); }},
      {"cast", [&](const Tensor& x) { ops::cast(x, c); }},
      {"adamw_step", [&](const Tensor& x) { ops::adamw_step(x, r, r, r, {}, Tensor{}); }},
  };
  for (const OpCall& op : calls) {
    INFO(op.name);
    Tensor gpu = on_gpu(buf.t);
    CHECK_THROWS_WITH_AS(op.call(gpu), doctest::Contains("share a device"), Error);
  }
#ifndef ENGINE_CUDA
  Tensor gpu = on_gpu(buf.t);
  CHECK_THROWS_WITH_AS(ops::scale_inplace(gpu, 2.0),
                       doctest::Contains("scale_inplace: tensors are on cuda"), Error);
  CHECK_THROWS_WITH_AS(ops::sum(gpu), doctest::Contains("sum: tensors are on cuda"), Error);
  CHECK_THROWS_WITH_AS(ops::count_nonfinite(gpu), doctest::Contains("no CUDA"), Error);
  CHECK_THROWS_WITH_AS(ops::gelu_forward(gpu, gpu), doctest::Contains("gelu_forward"), Error);
#endif
}
