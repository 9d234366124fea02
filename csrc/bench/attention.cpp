// Benchmarks of flash attention (cuda/attention, through ops::attention_forward/backward), causal,
// bf16, on the shapes of the PyTorch comparison in ../shared/DEVICE.md (hd128 B16 H16 S2048, hd128
// B4 H16 S8192, hd64 B16 H32 S2048; its fwd / fwd+bwd TFLOP/s printed beside ours as "peer") and a
// packed-documents batch (hd128 H16, 32768 tokens of documents of 64 .. 2047 tokens), beside as
// many sequences of its mean length; and one sequence of 8192 tokens whole and as 4 micro-sequence
// chunks of 2048 (queries of a chunk against the keys of the prefix up to its end:
// AttentionParams::kv), the same causal work.
// The B sequences of a batch are packed (cu_seqlens equally spaced). FLOPs count the causal half:
// forward 4 * sum_s L_s^2 / 2 * D * H (two matmuls), backward 2.5 times that (five).
// Each case prints fwd, bwd and fwd+bwd for each kernel side by side: [flash mma.sync] and
// [flash sm90] the engine's two flash kernels (ops::AttentionParams::kernel; sm90 where the
// Hopper kernels run), [cudnn] cuDNN's fused attention (ops::AttentionBackend::Cudnn, builds with
// cuDNN only). The environment variable BENCH_ATTENTION_BACKENDS (comma-separated among
// "mma.sync", "sm90", "cudnn"; default all) picks them. BENCH_ATTENTION_SHAPES (comma-separated
// parts of case names, e.g. "B4 H16 S8192,packed"; default all) picks the cases.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "core/buffer.h"
#include "core/rng.h"
#include "ops/attention.h"

#ifdef ENGINE_CUDA
#include "cuda/attention/cudnn_sdpa.cuh"
#include "cuda/attention/flash.cuh"
#include "cuda/common/device.cuh"
#endif

namespace engine::bench {
namespace {

#ifdef ENGINE_CUDA
// Random N(0, 1) bf16 values: a 1M-element tile made on the host, copied over the tensor.

struct AttnShape {
  std::string name;
  std::vector<int> lens;  // packed sequence lengths
  int heads, dim;
  std::string peer;  // the PyTorch figures, fwd / fwd+bwd
  int kv_heads = 0;  // grouped-query attention: key / value heads (0: heads)
};

struct Backend {
  ops::AttentionBackend kind;
  ops::AttentionKernel kernel;  // of the flash backend
  std::string tag;              // " [flash sm90]"
};

// The kernels to compare (see the top); BENCH_ATTENTION_BACKENDS narrows the list.
std::vector<Backend> backends() {
  const char* env = std::getenv("BENCH_ATTENTION_BACKENDS");
  const std::string want = env && *env ? env : "mma.sync,sm90,cudnn";
  std::vector<Backend> out;
  using K = ops::AttentionKernel;
  if (want.find("mma.sync") != std::string::npos)
    out.push_back({ops::AttentionBackend::Flash, K::MmaSync, " [flash mma.sync]"});
  if (want.find("sm90") != std::string::npos && cuda::attention_sm90_available(64) &&
      cuda::attention_sm90_available(128))
    out.push_back({ops::AttentionBackend::Flash, K::Sm90, " [flash sm90]"});
  if (want.find("cudnn") != std::string::npos && cuda::cudnn_built())
    out.push_back({ops::AttentionBackend::Cudnn, K::Auto, " [cudnn " + cuda::cudnn_version() + "]"});
  return out;
}

void run_shape(const AttnShape& s, const Backend& be, std::vector<Result>& out) {
  int64_t t = 0;
  double sq = 0;  // sum of L^2 / 2
  for (int l : s.lens) t += l, sq += 0.5 * l * static_cast<double>(l);
  const int64_t h = s.heads, d = s.dim, kv = s.kv_heads > 0 ? s.kv_heads : s.heads;
  Owned qkv = empty({t, h + 2 * kv, d}, DType::BF16, Device::CUDA);
  Owned o = empty({t, h, d}, DType::BF16, Device::CUDA), lse = empty({t, h}, DType::F32, Device::CUDA);
  Owned dout = empty({t, h, d}, DType::BF16, Device::CUDA);
  Owned dqkv = empty({t, h + 2 * kv, d}, DType::BF16, Device::CUDA);
  fill_random(qkv, "attention.qkv");
  fill_random(dout, "attention.dout");
  Owned cu_host = empty({static_cast<int64_t>(s.lens.size()) + 1}, DType::I32, Device::CPU);
  cu_host.ptr<int32_t>()[0] = 0;
  for (size_t i = 0; i < s.lens.size(); ++i)
    cu_host.ptr<int32_t>()[i + 1] = cu_host.ptr<int32_t>()[i] + s.lens[i];
  Owned cu = empty(cu_host->shape, DType::I32, Device::CUDA);
  copy_tensor(cu, cu_host);

  ops::AttentionParams p;
  p.qkv = qkv;
  p.out = o;
  p.lse = lse;
  p.cu_seqlens = cu;
  p.max_seqlen = *std::max_element(s.lens.begin(), s.lens.end());
  p.num_heads = s.heads;
  p.num_kv_heads = static_cast<int>(kv);
  p.head_dim = s.dim;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(s.dim));
  p.causal = true;
  p.backend = be.kind;
  p.kernel = be.kernel;
  const ops::AttentionBackwardParams bp{p, dout, dqkv};
  const double fwd_flops = 4.0 * sq * d * h;

  ops::attention_forward(p);  // out and lse for the backward-only timing
  out.push_back({s.name + " fwd" + be.tag, time_ms([&] { ops::attention_forward(p); }), fwd_flops, 0,
                 s.peer.empty() ? "" : "peer fwd / fwd+bwd: " + s.peer});
  out.push_back({s.name + " bwd" + be.tag, time_ms([&] { ops::attention_backward(bp); }), 2.5 * fwd_flops,
                 0, ""});
  out.push_back({s.name + " fwd+bwd" + be.tag, time_ms([&] {
                   ops::attention_forward(p);
                   ops::attention_backward(bp);
                 }),
                 3.5 * fwd_flops, 0, ""});
}

// One causal sequence of `len` tokens as `chunks` consecutive chunks, each chunk's queries against
// the keys and values of all rows up to its end (separate kv), run in order.
void run_chunks(const std::string& name, int len, int chunks, int heads, int dim, const Backend& be,
                std::vector<Result>& out) {
  const int64_t h = heads, d = dim, n = len / chunks;
  Owned qkv = empty({len, 3 * h, d}, DType::BF16, Device::CUDA);
  Owned kv = empty({len, 2 * h, d}, DType::BF16, Device::CUDA);
  Owned o = empty({len, h, d}, DType::BF16, Device::CUDA),
        lse = empty({len, h}, DType::F32, Device::CUDA);
  Owned dout = empty({len, h, d}, DType::BF16, Device::CUDA);
  Owned dqkv = empty({len, 3 * h, d}, DType::BF16, Device::CUDA);
  Owned dkv = empty({len, 2 * h, d}, DType::BF16, Device::CUDA);
  fill_random(qkv, "attention.qkv");
  fill_random(kv, "attention.kv");
  fill_random(dout, "attention.dout");
  std::vector<Owned> cus;
  std::vector<ops::AttentionBackwardParams> calls;
  for (int64_t c = 0; c < chunks; ++c) {
    Owned cu_host =
        empty({4}, DType::I32, Device::CPU);  // cu_seqlens (0, n), cu_seqlens_k (0, end)
    cu_host.ptr<int32_t>()[0] = 0;
    cu_host.ptr<int32_t>()[1] = static_cast<int32_t>(n);
    cu_host.ptr<int32_t>()[2] = 0;
    cu_host.ptr<int32_t>()[3] = static_cast<int32_t>((c + 1) * n);
    Owned cu = empty({4}, DType::I32, Device::CUDA);
    copy_tensor(cu, cu_host);
    ops::AttentionBackwardParams b;
    ops::AttentionParams& p = b.fwd;
    p.qkv = qkv->slice(c * n, (c + 1) * n);
    p.out = o->slice(c * n, (c + 1) * n);
    p.lse = lse->slice(c * n, (c + 1) * n);
    p.cu_seqlens = Tensor(cu->data, DType::I32, Device::CUDA, {2});
    p.max_seqlen = static_cast<int>(n);
    p.num_heads = heads;
    p.num_kv_heads = heads;
    p.head_dim = dim;
    p.softmax_scale = 1.f / std::sqrt(static_cast<float>(dim));
    p.causal = true;
    p.backend = be.kind;
    p.kernel = be.kernel;
    p.kv = kv->slice(0, (c + 1) * n);
    p.cu_seqlens_k = Tensor(cu.ptr<int32_t>() + 2, DType::I32, Device::CUDA, {2});
    p.max_seqlen_k = static_cast<int>((c + 1) * n);
    b.dout = dout->slice(c * n, (c + 1) * n);
    b.dqkv = dqkv->slice(c * n, (c + 1) * n);
    b.dkv = dkv->slice(0, (c + 1) * n);  // the caller would add each chunk's dkv into its own
    calls.push_back(b);
    cus.push_back(std::move(cu));
  }
  const double fwd_flops = 4.0 * 0.5 * len * static_cast<double>(len) * d * h;
  auto fwd = [&] {
    for (const auto& b : calls) ops::attention_forward(b.fwd);
  };
  auto bwd = [&] {
    for (const auto& b : calls) ops::attention_backward(b);
  };
  fwd();
  out.push_back({name + " fwd" + be.tag, time_ms(fwd), fwd_flops, 0, ""});
  out.push_back({name + " bwd" + be.tag, time_ms(bwd), 2.5 * fwd_flops, 0, ""});
  out.push_back({name + " fwd+bwd" + be.tag, time_ms([&] {
                   fwd();
                   bwd();
                 }),
                 3.5 * fwd_flops, 0, ""});
}

// Whether BENCH_ATTENTION_SHAPES (comma-separated name parts; unset or empty: all) picks `name`.
bool shape_wanted(const std::string& name) {
  const char* env = std::getenv("BENCH_ATTENTION_SHAPES");
  if (env == nullptr || *env == '\0') return true;
  const std::string want = env;
  for (size_t b = 0; b <= want.size();) {
    const size_t e = std::min(want.find(',', b), want.size());
    if (e > b && name.find(want.substr(b, e - b)) != std::string::npos) return true;
    b = e + 1;
  }
  return false;
}

std::vector<int> equal(int batch, int len) { return std::vector<int>(batch, len); }

// Documents of 64 .. 2047 tokens (uniform, fixed seed) filling `total` tokens.
std::vector<int> documents(int total) {
  std::vector<int> lens;
  const PhiloxKey key = philox_key(7, "attention.docs");
  for (uint64_t i = 0; total > 0; ++i) {
    const int l = std::min(total, 64 + static_cast<int>(philox_below(key, i, 2048 - 64)));
    lens.push_back(l);
    total -= l;
  }
  return lens;
}
#endif

}  // namespace

BENCH_CASES("attention") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  if (device::count() == 0) return out;
  const std::vector<AttnShape> shapes = {
      {"causal hd128 B16 H16 S2048", equal(16, 2048), 16, 128, "flash 285 / 221, cuDNN 512 / 392"},
      {"causal hd128 B4 H16 S8192", equal(4, 8192), 16, 128, "flash 331 / 290, cuDNN 598 / 497"},
      {"causal hd64 B16 H32 S2048", equal(16, 2048), 32, 64, "flash 244 / 200, cuDNN 387 / 309"},
  };
  constexpr int kPackedTokens = 32768;
  const std::vector<int> docs = documents(kPackedTokens);
  const int n_docs = static_cast<int>(docs.size()), mean_len = kPackedTokens / n_docs;
  const std::vector<AttnShape> more = {
      {"causal hd128 H16 packed " + std::to_string(n_docs) + " docs 64..2047, T=" +
           std::to_string(kPackedTokens),
       docs, 16, 128, ""},
      // The packed batch's document count at its mean length, every sequence alike: what the
      // same work costs without the spread of lengths.
      {"causal hd128 H16 B" + std::to_string(n_docs) + " S" + std::to_string(mean_len) +
           " (equal lengths: the packed documents' mean)",
       equal(n_docs, mean_len), 16, 128, ""},
      {"causal hd128 B1 H16 S8192", equal(1, 8192), 16, 128, ""},
      {"causal hd128 B4 H16 S4096", equal(4, 4096), 16, 128, ""},
      {"causal hd128 B4 H16 KV8 S4096 (the Llama 0.89B config: GQA)", equal(4, 4096), 16, 128, "", 8},
      {"causal hd64 B32 H12 S1024 (the GPT-2 162M config)", equal(32, 1024), 12, 64, ""},
  };
  const std::vector<Backend> bes = backends();
  for (const std::vector<AttnShape>* list : {&shapes, &more})
    for (const AttnShape& s : *list) {
      if (!shape_wanted(s.name)) continue;
      for (const Backend& be : bes) run_shape(s, be, out);
    }
  // The kv-prefix chunks run the mma.sync kernels under flash (the sm90 ones take no separate kv).
  const std::string chunks_name = "causal hd128 B1 H16 S8192 as 4 chunks (kv prefix)";
  for (const Backend& be : bes)
    if (be.kernel != ops::AttentionKernel::Sm90 && shape_wanted(chunks_name))
      run_chunks(chunks_name, 8192, 4, 16, 128, be, out);
#endif
  return out;
}

}  // namespace engine::bench
