// Memory-bound kernels at training sizes: T = 16384 tokens, C = 2048 and 4096, bf16 activations
// (rmsnorm, layernorm, rope, qk_norm, swiglu, gelu, embedding; forward and backward), and sum_rows (bias
// gradients) at the GPT-2 and Llama widths; the norms with the residual add fused, against the
// same work as separate kernels, at the Llama and GPT-2 shapes. Each result carries the bytes
// the op must read + write at least (statistics and parameter vectors included, scratch and
// cache traffic not), so GB/s compares with the H200 copy bandwidth (bench.h); a device copy of
// one (T, C) tensor, first at each width, shows what a copy of that size reaches.
// swiglu uses F = C (gate_up (T, 2C)); rope rotates every head of (T, C / 128, 128); qk_norm
// normalises the H = C / 128 q and H / 4 k heads of a packed (T, H + 2 H / 4, 128) qkv; embedding
// draws ids uniformly from V = 32000 and counts the distinct rows it must touch. Every case is
// timed back to back (Timing::Stream, bench.h), as the kernels run in a training step.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include "bench/bench.h"

#ifdef ENGINE_CUDA
#include "core/buffer.h"
#include "cuda/common/device.cuh"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/norm.h"
#include "ops/qk_norm.h"
#include "ops/rope.h"
#endif

namespace engine::bench {
namespace {

#ifdef ENGINE_CUDA

// A device tensor of uniform values in [-2, 2): a 1M-element host pattern repeated (cheap to
// make at any size; the values only need to be finite and varied).
Owned device_random(Shape s, DType dtype, uint64_t seed) {
  Owned d = empty(s, dtype, Device::CUDA);
  const int64_t n = d.t.numel(), chunk = std::min<int64_t>(n, int64_t{1} << 20);
  Owned h = empty({chunk}, dtype, Device::CPU);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < chunk; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const float v = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 4.f - 2.f;
    if (dtype == DType::BF16)
      h.ptr<bf16>()[i] = bf16(v);
    else
      h.ptr<float>()[i] = v;
  }
  const size_t es = dtype_size(dtype);
  for (int64_t off = 0; off < n; off += chunk)
    copy_bytes(static_cast<char*>(d.t.data) + off * es, Device::CUDA, h.t.data, Device::CPU,
               static_cast<size_t>(std::min(chunk, n - off)) * es);
  return d;
}

// ids (T) uniform in [0, vocab); returns the device tensor and the number of distinct ids.
std::pair<Owned, int64_t> device_ids(int64_t t, int64_t vocab, uint64_t seed) {
  Owned h = empty({t}, DType::I32, Device::CPU);
  std::unordered_set<int32_t> distinct;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < t; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    h.ptr<int32_t>()[i] = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
    distinct.insert(h.ptr<int32_t>()[i]);
  }
  Owned d = empty({t}, DType::I32, Device::CUDA);
  copy_tensor(d, h);
  return {std::move(d), static_cast<int64_t>(distinct.size())};
}

// These kernels are timed back to back (Timing::Stream): in a training step each follows the
// kernel before it with no event between them, which lets a kernel launched as a programmatic
// dependent start while the one ahead drains.
double stream_ms(const std::function<void()>& fn) { return time_ms(fn, 3, 10, Timing::Stream); }

std::string label(const char* op, int64_t t, int64_t c) {
  return std::string(op) + " T=" + std::to_string(t) + " C=" + std::to_string(c);
}

#endif

}  // namespace

BENCH_CASES("memory_bound") {
  std::vector<Result> results;
#ifdef ENGINE_CUDA
  if (device::count() == 0) {
    std::printf("  (no CUDA device: skipped)\n");
    return results;
  }
  constexpr int64_t kT = 16384, kVocab = 32000, kHeadDim = 128;
  constexpr double kB16 = 2, kF32 = 4;
  const DType bf = DType::BF16, f32 = DType::F32;
  for (int64_t c : {int64_t{2048}, int64_t{4096}}) {
    const double act = static_cast<double>(kT) * c * kB16;  // bytes of one (T, C) bf16 tensor
    {  // the yardstick at this size: a device-to-device copy of one (T, C) tensor
      Owned x = device_random({kT, c}, bf, 12), y = empty({kT, c}, bf, Device::CUDA);
      const double ms = stream_ms([&] { copy_tensor(y, x); });
      results.push_back({label("copy (cudaMemcpyAsync)", kT, c), ms, 0, 2 * act, ""});
    }
    {  // norms
      Owned x = device_random({kT, c}, bf, 1), w = device_random({c}, bf, 2),
            b = device_random({c}, bf, 3), dy = device_random({kT, c}, bf, 4);
      Owned y = empty({kT, c}, bf, Device::CUDA), dx = empty({kT, c}, bf, Device::CUDA);
      Owned mean = empty({kT}, f32, Device::CUDA), rstd = empty({kT}, f32, Device::CUDA);
      Owned dw = zeros({c}, f32, Device::CUDA), db = zeros({c}, f32, Device::CUDA);
      const double stat = kT * kF32, vec = c * kB16, grad = 2 * c * kF32;  // grad: read + write
      double ms = stream_ms([&] { ops::rmsnorm_forward(x, w, 1e-5f, y, rstd, {}); });
      results.push_back({label("rmsnorm fwd", kT, c), ms, 0, 2 * act + stat + vec, ""});
      ms = stream_ms([&] { ops::rmsnorm_backward(dy, x, w, rstd, dx, dw); });
      results.push_back({label("rmsnorm bwd", kT, c), ms, 0, 3 * act + stat + vec + grad, ""});
      ms = stream_ms([&] { ops::layernorm_forward(x, w, b, 1e-5f, y, mean, rstd, {}); });
      results.push_back({label("layernorm fwd", kT, c), ms, 0, 2 * act + 2 * stat + 2 * vec, ""});
      ms = stream_ms([&] { ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db); });
      results.push_back(
          {label("layernorm bwd", kT, c), ms, 0, 3 * act + 2 * stat + vec + 2 * grad, ""});
    }
    {  // rope (all heads rotated, in place; the angle changes nothing in the traffic)
      Owned x = device_random({kT, c / kHeadDim, kHeadDim}, bf, 5);
      Owned pos = empty({kT}, DType::I32, Device::CPU);
      for (int64_t t = 0; t < kT; ++t) pos.ptr<int32_t>()[t] = static_cast<int32_t>(t % 4096);
      Owned gpos = empty({kT}, DType::I32, Device::CUDA);
      copy_tensor(gpos, pos);
      const int heads = static_cast<int>(c / kHeadDim);
      const double ms = stream_ms([&] { ops::rope_forward(x, gpos, heads, ops::RopeParams{}); });
      results.push_back({label("rope fwd", kT, c) + " D=128", ms, 0, 2 * act + kT * 4.0, ""});
    }
    {  // qk_norm: q and k heads of a packed qkv (in place, the input saved)
      const int q = static_cast<int>(c / kHeadDim), kv = std::max(1, q / 4), n = q + kv;
      Owned x = device_random({kT, q + 2 * kv, kHeadDim}, bf, 12), w = device_random({2, kHeadDim}, bf, 13);
      Owned in = empty({kT, n, kHeadDim}, bf, Device::CUDA), rstd = empty({kT, n}, f32, Device::CUDA);
      Owned dw = zeros({2, kHeadDim}, f32, Device::CUDA);
      const double rows = static_cast<double>(kT) * n * kHeadDim * kB16, stat = static_cast<double>(kT) * n * kF32;
      double ms = stream_ms([&] { ops::qk_norm_forward(x, w, q, 1e-6f, in, rstd); });
      results.push_back({label("qk_norm fwd", kT, c) + " D=128", ms, 0, 3 * rows + stat, ""});
      ms = stream_ms([&] { ops::qk_norm_backward(x, in, w, q, rstd, dw); });
      results.push_back({label("qk_norm bwd", kT, c) + " D=128", ms, 0, 3 * rows + stat, ""});
    }
    {  // swiglu, F = C
      Owned gu = device_random({kT, 2 * c}, bf, 6), dy = device_random({kT, c}, bf, 7);
      Owned y = empty({kT, c}, bf, Device::CUDA), dgu = empty({kT, 2 * c}, bf, Device::CUDA);
      double ms = stream_ms([&] { ops::swiglu_forward(gu, y, {}); });
      results.push_back({label("swiglu fwd", kT, c) + " F=C", ms, 0, 3 * act, ""});
      ms = stream_ms([&] { ops::swiglu_backward(dy, gu, dgu, {}); });
      results.push_back({label("swiglu bwd", kT, c) + " F=C", ms, 0, 5 * act, ""});
    }
    {  // gelu
      Owned x = device_random({kT, c}, bf, 8), dy = device_random({kT, c}, bf, 9);
      Owned y = empty({kT, c}, bf, Device::CUDA);
      double ms = stream_ms([&] { ops::gelu_forward(x, y); });
      results.push_back({label("gelu fwd", kT, c), ms, 0, 2 * act, ""});
      ms = stream_ms([&] { ops::gelu_backward(dy, x, y); });
      results.push_back({label("gelu bwd", kT, c), ms, 0, 3 * act, ""});
    }
    {  // embedding: distinct rows read once (forward) / read + written once in f32 (backward)
      auto [ids, distinct] = device_ids(kT, kVocab, 10);
      Owned table = device_random({kVocab, c}, bf, 11), out = empty({kT, c}, bf, Device::CUDA);
      Owned dtable = zeros({kVocab, c}, f32, Device::CUDA);
      const double rows = static_cast<double>(distinct) * c;
      const std::string note = std::to_string(distinct) + " distinct ids of V=" + std::to_string(kVocab);
      // As the model calls it (ids checked on the host: no read-back), and with the device's own
      // id check read back (the op's default: the host waits for the kernels).
      for (ops::IdCheck check : {ops::IdCheck::kTrusted, ops::IdCheck::kRaise}) {
        const std::string how = check == ops::IdCheck::kRaise ? "; + id-check read-back" : "";
        double ms = stream_ms([&] { ops::embedding_forward(ids, table, out, false, 0, 0, check); });
        results.push_back({label("embedding fwd", kT, c) + (check == ops::IdCheck::kRaise ? " checked" : ""), ms,
                           0, kT * 4.0 + rows * kB16 + act, note + how});
        ms = stream_ms([&] { ops::embedding_backward(ids, out, dtable, 0, 0, check); });
        results.push_back({label("embedding bwd", kT, c) + (check == ops::IdCheck::kRaise ? " checked" : ""), ms,
                           0, kT * 4.0 + act + 2 * rows * kF32, note + how});
      }
    }
  }
  // Norms with the residual add fused (the blocks' norm2 forward, norm1 / norm2 backward), at the
  // Llama (T = 16384, C = 2048) and GPT-2 (T = 32768, C = 768) shapes: forward reads x and the
  // residual and writes sum and y; backward reads dy, x and dresidual and writes dx. The same
  // work as the separate kernels (ops::add / add_inplace and the plain norm) is timed beside it,
  // its GB/s on the fused form's bytes (so the two compare as times).
  for (auto [t, c] : {std::pair<int64_t, int64_t>{16384, 2048}, {32768, 768}}) {
    const double act = static_cast<double>(t) * c * kB16;
    Owned x = device_random({t, c}, bf, 13), r = device_random({t, c}, bf, 14),
          w = device_random({c}, bf, 15), b = device_random({c}, bf, 16),
          dy = device_random({t, c}, bf, 17), dres = device_random({t, c}, bf, 18);
    Owned sum = empty({t, c}, bf, Device::CUDA), y = empty({t, c}, bf, Device::CUDA),
          dx = empty({t, c}, bf, Device::CUDA);
    Owned mean = empty({t}, f32, Device::CUDA), rstd = empty({t}, f32, Device::CUDA);
    Owned dw = zeros({c}, f32, Device::CUDA), db = zeros({c}, f32, Device::CUDA);
    const double stat = t * kF32, vec = c * kB16, grad = 2 * c * kF32;
    const double rms_fwd = 4 * act + stat + vec, rms_bwd = 4 * act + stat + vec + grad;
    const double ln_fwd = 4 * act + 2 * stat + 2 * vec;
    const double ln_bwd = 4 * act + 2 * stat + vec + 2 * grad;
    const std::string sep = "add + norm as separate kernels";
    double ms = stream_ms([&] { ops::rmsnorm_residual_forward(x, r, w, 1e-5f, sum, y, rstd, {}); });
    results.push_back({label("rmsnorm+residual fwd", t, c), ms, 0, rms_fwd, "fused"});
    ms = stream_ms([&] {
      ops::add(x, r, sum);
      ops::rmsnorm_forward(sum, w, 1e-5f, y, rstd, {});
    });
    results.push_back({label("rmsnorm+residual fwd", t, c) + " separate", ms, 0, rms_fwd, sep});
    ms = stream_ms([&] { ops::rmsnorm_residual_backward(dy, sum, w, rstd, dres, dx, dw, Tensor{}); });
    results.push_back({label("rmsnorm+residual bwd", t, c), ms, 0, rms_bwd, "fused"});
    ms = stream_ms([&] {
      ops::rmsnorm_backward(dy, sum, w, rstd, dx, dw);
      ops::add_inplace(dx, dres);
    });
    results.push_back({label("rmsnorm+residual bwd", t, c) + " separate", ms, 0, rms_bwd, sep});
    ms = stream_ms([&] { ops::layernorm_residual_forward(x, r, w, b, 1e-5f, sum, y, mean, rstd, {}); });
    results.push_back({label("layernorm+residual fwd", t, c), ms, 0, ln_fwd, "fused"});
    ms = stream_ms([&] {
      ops::add(x, r, sum);
      ops::layernorm_forward(sum, w, b, 1e-5f, y, mean, rstd, {});
    });
    results.push_back({label("layernorm+residual fwd", t, c) + " separate", ms, 0, ln_fwd, sep});
    ms = stream_ms(
        [&] { ops::layernorm_residual_backward(dy, sum, w, mean, rstd, dres, dx, dw, db, Tensor{}); });
    results.push_back({label("layernorm+residual bwd", t, c), ms, 0, ln_bwd, "fused"});
    ms = stream_ms([&] {
      ops::layernorm_backward(dy, sum, w, mean, rstd, dx, dw, db);
      ops::add_inplace(dx, dres);
    });
    results.push_back({label("layernorm+residual bwd", t, c) + " separate", ms, 0, ln_bwd, sep});
    // With the column sums of dx (the bias gradient of the branch whose output gradient dx is:
    // a GPT-2 block's norm backward and the output bias it feeds), fused and as a sum_rows after.
    Owned dbias = zeros({c}, f32, Device::CUDA);
    const double ln_bwd_sum = ln_bwd + 2 * c * kF32;
    ms = stream_ms([&] {
      ops::layernorm_residual_backward(dy, sum, w, mean, rstd, dres, dx, dw, db, dbias);
    });
    results.push_back({label("layernorm+residual bwd + dx column sums", t, c), ms, 0, ln_bwd_sum,
                       "fused"});
    ms = stream_ms([&] {
      ops::layernorm_residual_backward(dy, sum, w, mean, rstd, dres, dx, dw, db, Tensor{});
      ops::sum_rows(dx, dbias, 1.f);
    });
    results.push_back({label("layernorm+residual bwd + dx column sums", t, c) + " separate", ms, 0,
                       ln_bwd_sum, "the fused norm, then sum_rows over dx"});
  }
  // sum_rows (the bias gradient of a linear layer): dY (T, N) bf16 column sums added into f32,
  // at the GPT-2 linears' widths (T = 32768) and one Llama-sized (T = 16384, N = 2048).
  for (auto [t, n] : {std::pair<int64_t, int64_t>{32768, 768}, {32768, 2304}, {32768, 3072}, {16384, 2048}}) {
    Owned dy = device_random({t, n}, bf, 12);
    Owned db = zeros({n}, f32, Device::CUDA);
    const double ms = stream_ms([&] { ops::sum_rows(dy, db, 1.f); });
    results.push_back({"sum_rows T=" + std::to_string(t) + " N=" + std::to_string(n), ms, 0,
                       t * n * kB16 + 2 * n * kF32, "bias gradient, f32 +="});
  }
#endif
  return results;
}

}  // namespace engine::bench
