// Benchmarks of the cuBLASLt GEMM (cuda/gemm/gemm.cu) on the shapes training runs:
//   8192^3 bf16 (peer: PyTorch 774 TFLOP/s on one H200, ../shared/DEVICE.md);
//   the 0.89B Llama (T = 16384 tokens, hidden 2048): qkv 2048->4096, o 2048->2048,
//   gate_up 2048->11264, down 5632->2048, lm head 2048->32000;
//   GPT-2 (T = 32768, hidden 768): qkv 768->2304, fc 768->3072, proj 3072->768, lm head 768->50304.
// Each linear (T, in) -> (T, out) with weight W (out, in) runs as in layers/linear.cpp:
//   fwd   Y = X W^T    (NT, bf16 out)          dgrad dX = dY W   (NN, bf16 out)
//   wgrad dW += dY^T X (TN, f32 out, beta = 1)
// GPT-2 shapes also time the bias epilogue (fwd + bias) and the fused bias gradient (wgrad +
// dbias, cuda::gemm's dbias_a). Operands hold random bf16 values (a tile copied over the tensor:
// GEMM power, hence clocks, depends on the data). sum_rows (bias gradient alone) is timed in GB/s.
// The GPT-2 MLP's GELU both ways, as layers/mlp.cpp runs it (epilogues) and as separate kernels:
//   fc fwd:     h = x W_in^T + b, a = gelu(h)         (GELU_AUX_BIAS)
//   proj dgrad: dh = (dy W_out) * gelu'(h), db = sum dh (DGELU_BGRAD)
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "core/buffer.h"
#include "ops/activation.h"
#include "ops/gemm.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#include "cuda/gemm/gemm.cuh"
#endif

namespace engine::bench {
namespace {

#ifdef ENGINE_CUDA
struct Linear {
  const char* model;
  const char* name;
  int64_t t, in, out;
  bool bias;  // GPT-2: also time fwd + bias and wgrad + fused dbias
};
#endif

}  // namespace

BENCH_CASES("gemm") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  if (device::count() == 0) return out;
  {  // the peer's square case
    const int64_t n = 8192;
    Owned a = empty({n, n}, DType::BF16, Device::CUDA), b = empty({n, n}, DType::BF16, Device::CUDA);
    Owned c = empty({n, n}, DType::BF16, Device::CUDA), c32 = zeros({n, n}, DType::F32, Device::CUDA);
    fill_random(a, "gemm.a", 1.0);
    fill_random(b, "gemm.b", 1.0);
    const double flops = 2.0 * n * n * n;
    out.push_back({"8192^3 NN bf16", time_ms([&] { ops::matmul(a, false, b, false, c, {}); }), flops, 0,
                   "peer: PyTorch 774 TFLOP/s"});
    out.push_back({"8192^3 NT bf16", time_ms([&] { ops::matmul(a, false, b, true, c, {}); }), flops, 0, ""});
    out.push_back({"8192^3 TN f32 beta=1", time_ms([&] { ops::matmul(a, true, b, false, c32, {1.f, 1.f, {}}); }),
                   flops, 0, ""});
  }
  const Linear shapes[] = {
      {"llama-0.89B", "qkv", 16384, 2048, 4096, false},
      {"llama-0.89B", "o", 16384, 2048, 2048, false},
      {"llama-0.89B", "gate_up", 16384, 2048, 11264, false},
      {"llama-0.89B", "down", 16384, 5632, 2048, false},
      {"llama-0.89B", "lm_head", 16384, 2048, 32000, false},
      {"gpt2", "qkv", 32768, 768, 2304, true},
      {"gpt2", "fc", 32768, 768, 3072, true},
      {"gpt2", "proj", 32768, 3072, 768, true},
      {"gpt2", "lm_head", 32768, 768, 50304, false},
  };
  for (const Linear& s : shapes) {
    Owned x = empty({s.t, s.in}, DType::BF16, Device::CUDA), w = empty({s.out, s.in}, DType::BF16, Device::CUDA);
    Owned y = empty({s.t, s.out}, DType::BF16, Device::CUDA), dx = empty({s.t, s.in}, DType::BF16, Device::CUDA);
    Owned dw = zeros({s.out, s.in}, DType::F32, Device::CUDA), bias = empty({s.out}, DType::BF16, Device::CUDA);
    Owned dbias = zeros({s.out}, DType::F32, Device::CUDA);
    fill_random(x, "gemm.x", 1.0);
    fill_random(w, "gemm.w", 0.02);
    fill_random(y, "gemm.dy", 1.0);  // used as dY by the backward cases
    fill_random(bias, "gemm.bias", 0.02);
    const double flops = 2.0 * s.t * s.in * s.out;
    const std::string base = std::string(s.model) + " " + s.name + " T=" + std::to_string(s.t) + " " +
                             std::to_string(s.in) + "->" + std::to_string(s.out);
    out.push_back({base + " fwd NT", time_ms([&] { ops::matmul(x, false, w, true, y, {}); }), flops, 0, ""});
    out.push_back(
        {base + " dgrad NN", time_ms([&] { ops::matmul(y, false, w, false, dx, {}); }), flops, 0, ""});
    out.push_back({base + " wgrad TN f32+=", time_ms([&] { ops::matmul(y, true, x, false, dw, {1.f, 1.f, {}}); }),
                   flops, 0, ""});
    if (s.bias) {
      out.push_back({base + " fwd NT + bias", time_ms([&] { ops::matmul(x, false, w, true, y, {1.f, 0.f, bias}); }),
                     flops, 0, ""});
      cuda::GemmParams p;
      p.a = y, p.trans_a = true, p.b = x, p.trans_b = false, p.c = dw, p.beta = 1.f, p.dbias_a = dbias;
      const double ms = time_ms([&] { cuda::gemm(p); });
      out.push_back({base + " wgrad TN f32+= + dbias", ms, flops, 0,
                     cuda::gemm_last_call().fused_epilogue ? "fused BGRADB" : "separate sum kernel"});
      out.push_back({base + " sum_rows (dbias alone)", time_ms([&] { ops::sum_rows(y, dbias, 1.f); }), 0,
                     2.0 * s.t * s.out + 8.0 * s.out, ""});
    }
  }
  {  // the GPT-2 MLP's GELU: epilogues against separate kernels
    const int64_t t = 32768, c = 768, f = 3072;
    Owned x = empty({t, c}, DType::BF16, Device::CUDA), w_in = empty({f, c}, DType::BF16, Device::CUDA);
    Owned w_out = empty({c, f}, DType::BF16, Device::CUDA), b_in = empty({f}, DType::BF16, Device::CUDA);
    Owned h = empty({t, f}, DType::BF16, Device::CUDA), a = empty({t, f}, DType::BF16, Device::CUDA);
    Owned dy = empty({t, c}, DType::BF16, Device::CUDA), dh = empty({t, f}, DType::BF16, Device::CUDA);
    Owned db = zeros({f}, DType::F32, Device::CUDA);
    fill_random(x, "mlp.x", 1.0);
    fill_random(w_in, "mlp.w_in", 0.02);
    fill_random(w_out, "mlp.w_out", 0.02);
    fill_random(b_in, "mlp.b_in", 0.02);
    fill_random(dy, "mlp.dy", 1.0);
    const double flops = 2.0 * t * c * f;
    const std::string base = "gpt2 mlp T=32768 768<->3072";
    out.push_back({base + " fc fwd + bias, gelu kernel", time_ms([&] {
                     ops::matmul(x, false, w_in, true, h, {1.f, 0.f, b_in});
                     ops::gelu_forward(h, a);
                   }),
                   flops, 0, "separate"});
    ops::MatmulOptions fo;
    fo.bias = b_in;
    fo.gelu = true;
    fo.gelu_input = h;
    const double fwd_ms = time_ms([&] { ops::matmul(x, false, w_in, true, a, fo); });
    out.push_back({base + " fc fwd + bias + gelu epilogue", fwd_ms, flops, 0,
                   cuda::gemm_last_call().fused_epilogue ? "fused GELU_AUX_BIAS" : "separate kernels (no fused algorithm)"});
    out.push_back({base + " proj dgrad, gelu bwd + sum_rows", time_ms([&] {
                     ops::matmul(dy, false, w_out, false, dh, {});
                     ops::gelu_backward(dh, h, dh);
                     ops::sum_rows(dh, db, 0.f);
                   }),
                   flops, 0, "separate"});
    ops::MatmulOptions bo;
    bo.dgelu_input = h;
    bo.dbias = db;
    const double bwd_ms = time_ms([&] { ops::matmul(dy, false, w_out, false, dh, bo); });
    const auto how = [] {
      const cuda::GemmLastCall l = cuda::gemm_last_call();
      return std::string(!l.fused_epilogue ? "separate kernels (no fused algorithm)"
                         : l.fallback_kernels ? "fused DGELU, then the bias-gradient kernel"
                                              : "fused DGELU_BGRAD");
    };
    out.push_back({base + " proj dgrad + dgelu + dbias epilogue", bwd_ms, flops, 0, how()});
    // What cuBLASLt fuses: DGELU alone (the bias gradient by sum_rows after it), and
    // DGELU_BGRAD with a bf16 bias gradient.
    cuda::GemmParams g;
    g.a = dy, g.b = w_out, g.c = dh, g.dgelu_input = h;
    const double dgelu_ms = time_ms([&] { cuda::gemm(g); });
    const bool dgelu_fused = cuda::gemm_last_call().fused_epilogue;
    out.push_back({base + " proj dgrad + dgelu epilogue (no dbias)", dgelu_ms, flops, 0,
                   dgelu_fused ? "fused DGELU" : "separate kernels (no fused algorithm)"});
    out.push_back({base + " proj dgrad + dgelu epilogue, then sum_rows", time_ms([&] {
                     cuda::gemm(g);
                     ops::sum_rows(dh, db, 0.f);
                   }),
                   flops, 0, dgelu_fused ? "fused DGELU + sum kernel" : "separate kernels"});
    Owned db16 = zeros({f}, DType::BF16, Device::CUDA);
    g.dbias_out = db16;
    const double bgrad16_ms = time_ms([&] { cuda::gemm(g); });
    out.push_back({base + " proj dgrad + dgelu + bf16 dbias epilogue", bgrad16_ms, flops, 0, how()});
  }
#endif
  return out;
}

}  // namespace engine::bench
