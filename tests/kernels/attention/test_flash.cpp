// Flash attention on the GPU (cuda/attention) against the CPU reference (csrc/ref/attention.cpp)
// run in f64 on the same bf16-rounded inputs: out, lse and the whole dqkv (dq, dk, dv parts
// compared separately), for a table of cases over the mma.sync head dims (64, 128) and the
// f32 fallback (16, 6, 32); GQA ratios 1, 4, 2 and 8 (H/Hkv 4/4, 8/2, 6/3, 16/2); causal and not;
// windows shorter than the sequences (down to 1); several sequences of lengths that are not
// multiples of the tiles (1, 17, 64, 129, 300) including zero-length ones; a single sequence
// of 1000; a large softmax scale; enough (kv head, sequence) pairs for the backward to launch
// in several sections (its launch order). Outputs are poisoned (NaN) first, so any element left
// unwritten fails. Also: run-to-run determinism, and the launcher's argument checks; separate
// keys (kv, micro-sequences; at the end of the file).
// Forward kernels: the table runs once with the mma.sync forward and, where it runs (an sm_90a
// build on a compute capability 9.0 GPU), once with the Hopper forward (cuda/attention/
// flash_sm90.cu; ops::AttentionParams::kernel; with it the Hopper backward, flash_bwd_sm90.cu),
// whose own cases follow the table: more tiles per sequence (pipeline stages wrap),
// odd document lengths, windows crossing tiles, and a comparison with the mma.sync kernels on
// larger batches.
//
// Tolerances (relative RMS error over the whole tensor, err = rms(got - ref) / rms(ref)):
//   out 1e-2:  out is rounded to bf16 (relative RMS 2^-9 / sqrt(3) ~ 1.1e-3) and P is rounded
//              to bf16 before P V (about as much again): a few 1e-3 expected.
//   lse 1e-3:  computed in f32 from exact bf16 products with f32 accumulation: ~1e-6 expected;
//              1e-3 still catches any wrong mask or missing key (lse moves by O(1 / L) at least).
//   dqkv 2e-2: P and dS = P (dP - dsum) are rounded to bf16 before the dV, dK, dQ products,
//              dsum uses the bf16 out, and dqkv is rounded to bf16: several 1e-3 expected.
// The measured errors of each case are printed, to keep an eye on the margins.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "tests/common/attention_case.h"
#include "tests/common/attention_checks.h"
#ifdef ENGINE_CUDA
#include "cuda/attention/flash.cuh"
#endif
#include "tests/common/gpu_testing.h"
#include "tests/common/testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

using FlashCase = testing::AttentionCase;

// The flash kernel of a name ("mma.sync", "sm90"), for AttentionParams::kernel.
ops::AttentionKernel kernel_named(const std::string& name) {
  return name == "sm90" ? ops::AttentionKernel::Sm90 : ops::AttentionKernel::MmaSync;
}

// Whether the Hopper forward runs here (after gpu_available_or_skip); says so once when not.
bool sm90_runs() {
#ifdef ENGINE_CUDA
  static const bool ok = [] {
    const bool r = cuda::attention_sm90_available(64) && cuda::attention_sm90_available(128);
    if (!r)
      std::printf("flash: the sm90 forward does not run here (it needs an sm_90a build on a "
                  "compute capability 9.0 GPU): its cases are skipped\n");
    return r;
  }();
  return ok;
#else
  return false;
#endif
}

// The forward kernels every table case runs with.
std::vector<std::string> forward_kernels() {
  std::vector<std::string> k = {"mma.sync"};
  if (sm90_runs()) k.push_back("sm90");
  return k;
}

const std::vector<FlashCase> kCases = {
    // mma.sync, D = 128 (forward tiles 128 x 64, backward 64 x 128)
    {{1, 17, 64, 129, 300}, 4, 4, 128, true, 0},
    {{300, 1, 129, 17, 64}, 8, 2, 128, false, 0},
    {{129, 300, 17}, 6, 3, 128, true, 100},
    {{300, 129}, 4, 4, 128, false, 70},
    {{257, 0, 130}, 6, 3, 128, true, 1},  // window 1: each query sees only itself
    // GQA 8 over 10 (kv head, sequence) pairs: the backward's launch order (flash_layout.h
    // bwd_block) then runs in sections of 4 pairs (4, 4 and a short one of 2), not just one.
    {{400, 399, 1, 400, 257}, 16, 2, 128, true, 0},
    // mma.sync, D = 64 (forward tiles 128 x 128)
    {{17, 129, 1, 300}, 4, 4, 64, true, 0},
    {{64, 300, 129}, 6, 3, 64, false, 50},
    {{0, 129, 0, 64, 1, 0}, 8, 2, 64, true, 0},  // zero-length sequences around short ones
    {{300, 17}, 8, 2, 64, true, 0, 0.5f},        // peaked softmax: the running max matters
    {{400, 399, 1, 400, 257}, 16, 2, 64, false, 0},  // launch sections of 8 pairs (8, then 2)
    // f32 fallback
    {{17, 129, 300}, 8, 2, 16, true, 0},
    {{1, 64, 129}, 6, 3, 16, false, 30},
    {{300, 17}, 4, 4, 6, true, 40},
    {{129, 0, 64, 1}, 6, 3, 6, false, 0},
    {{65, 33}, 6, 2, 32, true, 0},
};
// The gpu-slow tier: one long document for each kernel family (8 forward q tiles, 16 backward
// key tiles; with a window of 200 at D = 64).
const std::vector<FlashCase> kLargeCases = {
    {{1000}, 8, 2, 128, true, 0},
    {{1000}, 4, 4, 64, true, 200},
    {{1000}, 4, 4, 16, true, 0},
};

// The CPU tensors of one problem (f64 holding bf16-rounded values) and their GPU copies.
struct Problem {
  FlashCase c;
  Owned qkv_ref, dout_ref, cu_host;  // CPU, f64 / i32
  Owned qkv, dout, cu;               // GPU, bf16 / i32

  explicit Problem(const FlashCase& fc) : c(fc) {
    const int64_t t = c.rows(), nh = c.heads + 2 * c.kv_heads;
    qkv = to_device(randn({t, nh, c.dim}, DType::F32, "flash.qkv"), Device::CUDA, DType::BF16);
    dout = to_device(randn({t, c.heads, c.dim}, DType::F32, "flash.dout"), Device::CUDA,
                     DType::BF16);
    qkv_ref = to_host(qkv, DType::F64);
    dout_ref = to_host(dout, DType::F64);
    cu_host = empty({static_cast<int64_t>(c.lens.size()) + 1}, DType::I32, Device::CPU);
    int32_t* cu_p = cu_host.ptr<int32_t>();
    cu_p[0] = 0;
    for (size_t s = 0; s < c.lens.size(); ++s) cu_p[s + 1] = cu_p[s] + c.lens[s];
    cu = to_device(cu_host, Device::CUDA);
  }

  ops::AttentionParams params(const Tensor& qkv_t, const Tensor& out, const Tensor& lse,
                              const Tensor& cu_t) const {
    ops::AttentionParams p;
    p.qkv = qkv_t;
    p.out = out;
    p.lse = lse;
    p.cu_seqlens = cu_t;
    p.max_seqlen = c.max_len();
    p.num_heads = c.heads;
    p.num_kv_heads = c.kv_heads;
    p.head_dim = c.dim;
    p.softmax_scale = c.softmax_scale();
    p.causal = c.causal;
    p.window = c.window;
    return p;
  }
};

struct GpuResult {
  Owned out, lse, dqkv;
};

GpuResult run_gpu(const Problem& pr, ops::AttentionKernel kernel = ops::AttentionKernel::Auto) {
  const int64_t t = pr.c.rows();
  GpuResult r{empty({t, pr.c.heads, pr.c.dim}, DType::BF16, Device::CUDA),
              empty({t, pr.c.heads}, DType::F32, Device::CUDA),
              empty(pr.qkv->shape, DType::BF16, Device::CUDA)};
  poison(r.out);
  poison(r.lse);
  poison(r.dqkv);
  ops::AttentionParams p = pr.params(pr.qkv, r.out, r.lse, pr.cu);
  p.kernel = kernel;
  ops::attention_forward(p);
  ops::attention_backward({p, pr.dout, r.dqkv});
  return r;
}

void check_case(const FlashCase& c, const std::string& kernel) {
  const Problem pr(c);
  const int64_t t = c.rows(), h = c.heads, hkv = c.kv_heads;
  GpuResult gpu = run_gpu(pr, kernel_named(kernel));

  Owned out_ref = empty({t, h, c.dim}, DType::F64, Device::CPU);
  Owned lse_ref = empty({t, h}, DType::F64, Device::CPU);
  Owned dqkv_ref = empty(pr.qkv_ref->shape, DType::F64, Device::CPU);
  const ops::AttentionParams p = pr.params(pr.qkv_ref, out_ref, lse_ref, pr.cu_host);
  ops::attention_forward(p);
  ops::attention_backward({p, pr.dout_ref, dqkv_ref});

  const double e_out = check_close(gpu.out, out_ref, 1e-2, "out");
  const double e_lse = check_close(gpu.lse, lse_ref, 1e-3, "lse");
  const double e_dq = check_close(heads_of(gpu.dqkv, 0, h), heads_of(dqkv_ref, 0, h), 2e-2, "dq");
  const double e_dk =
      check_close(heads_of(gpu.dqkv, h, hkv), heads_of(dqkv_ref, h, hkv), 2e-2, "dk");
  const double e_dv =
      check_close(heads_of(gpu.dqkv, h + hkv, hkv), heads_of(dqkv_ref, h + hkv, hkv), 2e-2, "dv");
  std::printf("flash [%s] %-62s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", kernel.c_str(),
              c.name().c_str(), e_out, e_lse, e_dq, e_dk, e_dv);
}

}  // namespace

namespace {
void reference_sweep(const std::vector<FlashCase>& cases) {
  if (!engine::testing::gpu_available_or_skip()) return;
  for (const std::string& k : forward_kernels())
    for (const FlashCase& c : cases) {
      if (k == "sm90" && c.dim != 64 && c.dim != 128) continue;  // the same fallback run again
      SUBCASE((k + ": " + c.name()).c_str()) { check_case(c, k); }
    }
}
}  // namespace
GPU_TEST_SWEEP("flash attention forward and backward match the f64 reference (bf16 inputs)",
               reference_sweep, kCases, kLargeCases)

TEST_CASE("flash attention: attention_kernel_name says which kernels a call runs" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  const auto name = [](Device dev, int d, ops::AttentionKernel k = ops::AttentionKernel::Auto) {
    return std::string(ops::attention_kernel_name(dev, d, k));
  };
  CHECK(name(Device::CPU, 64) == "reference");
  CHECK(name(Device::CUDA, 16) == "fallback");
  CHECK(name(Device::CUDA, 16, ops::AttentionKernel::Sm90) == "fallback");
  CHECK(name(Device::CUDA, 264) == "unsupported");
  for (int d : {64, 128}) {
    CAPTURE(d);
    CHECK(name(Device::CUDA, d, ops::AttentionKernel::MmaSync) == "mma.sync");
    CHECK(name(Device::CUDA, d) == (sm90_runs() ? "sm90" : "mma.sync"));
    CHECK(name(Device::CUDA, d, ops::AttentionKernel::Sm90) == name(Device::CUDA, d));
  }
}

// ---- The Hopper forward (flash_sm90.cu) -----------------------------------------------------------

// Forward tiles 128 x 128, backward 128 keys x 64 queries. The small tier: tile-exact lengths
// (128, 256, 384), a non-causal window crossing tile boundaries (tiles whose first keys are
// invisible to some rows), GQA 1, 2 and 4 (the backward's q-head loop), a few tiles per
// document. The large tier: documents of 1 .. 1500 tokens, up to 12 key tiles per q tile and 24
// q tiles per key tile (the 2-stage rings wrap), peaked softmax over long rows, and the
// backward's launch order at hd128 (flash_bwd_sm90.cu launch): sections of the (kv head,
// sequence) pairs whose q, dO and dQ rows fit 24 MB, the last four merged. GQA 4 at 400 tokens:
// 1.6 MB a pair, sections of 8 pairs; 4 kv heads x 12 sequences = 48 pairs, so two regular
// sections, then the merged tail of 32 pairs (the other cases have three sections or fewer: the
// tail alone).
namespace {
const std::vector<FlashCase> kSm90Cases = {
    {{256, 128, 384, 1}, 4, 4, 128, true, 0},
    {{1, 7, 129, 300}, 8, 2, 128, true, 0},
    {{700, 1, 64}, 4, 1, 128, false, 200},
    {{513, 2, 255}, 4, 4, 64, false, 129},
    {{300, 1, 129}, 6, 3, 64, true, 100},
};
const std::vector<FlashCase> kSm90LargeCases = {
    {{1, 7, 129, 300, 1000}, 8, 2, 128, true, 0},
    {{1000, 7, 1, 300, 129}, 4, 2, 128, false, 0},
    {{1500, 7}, 4, 4, 128, true, 300},
    {{1, 7, 129, 300, 1000}, 6, 3, 64, true, 0},
    {{1200}, 16, 2, 64, true, 0, 0.5f},  // peaked softmax
    {{1200, 65}, 8, 2, 128, true, 0, 0.5f},
    {{400, 1, 399, 129, 256, 7, 400, 300, 65, 128, 250, 390}, 16, 4, 128, true, 0},
};
void sm90_sweep(const std::vector<FlashCase>& cases) {
  if (!engine::testing::gpu_available_or_skip() || !sm90_runs()) return;
  for (const FlashCase& c : cases) {
    SUBCASE(c.name().c_str()) { check_case(c, "sm90"); }
  }
}
}  // namespace
GPU_TEST_SWEEP("flash attention sm90 kernels match the f64 reference: tiles, odd documents, windows",
               sm90_sweep, kSm90Cases, kSm90LargeCases)

// The gpu-slow tier: large batches (thousands of tokens a document) are what it checks.
TEST_CASE("flash attention sm90 kernels agree with the mma.sync kernels on larger batches" * doctest::test_suite("gpu-slow")) {
  // Both against each other (no CPU reference): thousands of tokens, 16 key tiles per q tile.
  // out differs by the two kernels' bf16 roundings of P and out (each ~3e-3 from the exact
  // values), lse only by f32 summation order, dqkv by the roundings of P, dS and dqkv.
  if (!engine::testing::gpu_available_or_skip() || !sm90_runs()) return;
  // hd128 up to 2048 keys runs the grouped forward (items in groups whose K, V fit in 32 MiB of
  // L2): 4 sequences x 12 heads of up to 2048 tokens make more than one group.
  const std::vector<FlashCase> cases = {
      {{2048, 2048}, 8, 2, 128, true, 0},
      {{2048, 2000, 1500, 700}, 12, 12, 128, true, 0},
      {{2048, 33, 1700, 64, 2000}, 4, 4, 128, false, 0},
      {{2048, 2048}, 8, 8, 64, true, 0},
      {{4000, 95}, 4, 2, 64, true, 1000},
  };
  for (const FlashCase& c : cases) {
    SUBCASE(c.name().c_str()) {
      const Problem pr(c);
      GpuResult r[2];
      const char* names[2] = {"mma.sync", "sm90"};
      for (int k = 0; k < 2; ++k) r[k] = run_gpu(pr, kernel_named(names[k]));
      const double e_out = check_close(r[1].out, r[0].out, 1e-2, "out sm90 vs mma.sync");
      const double e_lse = check_close(r[1].lse, r[0].lse, 1e-5, "lse sm90 vs mma.sync");
      const double e_dqkv = check_close(r[1].dqkv, r[0].dqkv, 2e-2, "dqkv sm90 vs mma.sync");
      std::printf("flash [sm90 vs mma.sync] %-50s out %.1e lse %.1e dqkv %.1e\n",
                  c.name().c_str(), e_out, e_lse, e_dqkv);
    }
  }
}

TEST_CASE("flash attention: forward, dk and dv are deterministic; dq to atomics noise" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  for (const FlashCase& c : {FlashCase{{300, 129, 17}, 8, 2, 128, true, 0},
                             FlashCase{{129, 300}, 6, 3, 64, false, 0},
                             FlashCase{{129, 17}, 6, 3, 16, true, 0}}) {
    SUBCASE(c.name().c_str()) {
      const Problem pr(c);
      GpuResult a = run_gpu(pr), b = run_gpu(pr);
      CHECK(bitwise_equal(a.out, b.out));
      CHECK(bitwise_equal(a.lse, b.lse));
      const int64_t h = c.heads, hkv = c.kv_heads;
      CHECK(bitwise_equal(heads_of(a.dqkv, h, 2 * hkv), heads_of(b.dqkv, h, 2 * hkv)));
      // dq sums f32 atomics in varying order before rounding to bf16: a few ulp apart at most.
      check_close(heads_of(a.dqkv, 0, h), heads_of(b.dqkv, 0, h), 1e-3, "dq run to run");
    }
  }
}

TEST_CASE("flash attention launchers reject bad arguments, naming them" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  const Problem pr(FlashCase{{5, 9}, 4, 2, 64, true, 0});
  Owned out = empty({14, 4, 64}, DType::BF16, Device::CUDA);
  Owned lse = empty({14, 4}, DType::F32, Device::CUDA);
  Owned lse_bf16 = empty({14, 4}, DType::BF16, Device::CUDA);
  Owned qkv_f32 = to_device(to_host(pr.qkv, DType::F32), Device::CUDA);
  const ops::AttentionParams good = pr.params(pr.qkv, out, lse, pr.cu);
  ops::attention_forward(good);  // the baseline is accepted

  ops::AttentionParams p = good;
  p.qkv = qkv_f32;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("qkv"), Error);
  p = good;
  p.lse = lse_bf16;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("lse"), Error);
  p = good;
  p.num_kv_heads = 3;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("num_kv_heads"), Error);
  p = good;
  p.softmax_scale = 0.f;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("softmax_scale"), Error);
  // A qkv view starting 2 bytes in: misaligned for the 16-byte loads of the mma path.
  Owned big = empty({15, 8, 64}, DType::BF16, Device::CUDA);
  p = good;
  p.qkv = Tensor(static_cast<char*>(big->data) + 2, DType::BF16, Device::CUDA, {14, 8, 64});
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("aligned"), Error);
  // Head dims past the fallback's limit.
  Owned wide = empty({14, 8, 264}, DType::BF16, Device::CUDA);
  Owned wide_out = empty({14, 4, 264}, DType::BF16, Device::CUDA);
  p = good;
  p.qkv = wide;
  p.out = wide_out;
  p.head_dim = 264;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("head_dim"), Error);
  // Backward: dout of the wrong shape.
  Owned dqkv = empty(pr.qkv->shape, DType::BF16, Device::CUDA);
  Owned dout_bad = empty({14, 4, 32}, DType::BF16, Device::CUDA);
  CHECK_THROWS_WITH_AS(ops::attention_backward({good, dout_bad, dqkv}), doctest::Contains("dout"),
                       Error);
}

// ---- Separate keys (ops::AttentionParams::kv): micro-sequences ---------------------------------
// Against the f64 reference with the same kv (which tests/ref checks by finite differences and
// by chunking), tolerances as above; and the chunk equivalence the layers rely on: a batch cut
// into chunks, each run with the keys of its prefix, gives the whole batch's out, lse and dq,
// and its chunks' dkv sum to the whole batch's dk, dv.

namespace {

Owned offsets_on(const std::vector<int32_t>& cu, Device dev) {
  Owned host = empty({static_cast<int64_t>(cu.size())}, DType::I32, Device::CPU);
  std::copy(cu.begin(), cu.end(), host.ptr<int32_t>());
  return dev == Device::CPU ? std::move(host) : to_device(host, dev);
}
std::vector<int32_t> offsets_of(const std::vector<int>& lens) {
  std::vector<int32_t> cu = {0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

struct KvCase {
  FlashCase c;              // c.lens: queries per sequence
  std::vector<int> lens_k;  // keys per sequence, >= the queries (the queries are the last ones)
};
const std::vector<KvCase> kKvCases = {
    {{{1, 200, 0, 130}, 8, 2, 128, true, 0}, {300, 200, 64, 517}},  // no queries: dK = dV = 0
    {{{65, 3}, 4, 4, 128, false, 0}, {65, 400}},
    {{{129, 1, 70}, 6, 3, 128, true, 60}, {700, 129, 300}},  // key tiles older than every window
    {{{129, 1}, 6, 3, 64, true, 100}, {700, 129}},
    {{{17, 0, 40}, 6, 2, 64, false, 20}, {80, 33, 40}},
    {{{5, 0, 30}, 4, 2, 16, true, 0}, {90, 7, 31}},  // fallback
    {{{20, 9}, 4, 4, 80, true, 25}, {20, 60}},       // fallback
};

}  // namespace

TEST_CASE("flash attention with separate keys matches the f64 reference" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  for (const KvCase& kc : kKvCases) {
    SUBCASE(kc.c.name().c_str()) {
      const FlashCase& c = kc.c;
      const Problem pr(c);
      const int64_t t = c.rows(), h = c.heads, hkv = c.kv_heads;
      const int64_t tk = std::accumulate(kc.lens_k.begin(), kc.lens_k.end(), int64_t{0});
      Owned kv =
          to_device(randn({tk, 2 * hkv, c.dim}, DType::F32, "flash.kv"), Device::CUDA, DType::BF16);
      Owned kv_ref = to_host(kv, DType::F64);
      Owned cu_k = offsets_on(offsets_of(kc.lens_k), Device::CUDA);
      Owned cu_k_host = offsets_on(offsets_of(kc.lens_k), Device::CPU);
      const int max_k = *std::max_element(kc.lens_k.begin(), kc.lens_k.end());

      Owned out = empty({t, h, c.dim}, DType::BF16, Device::CUDA),
            lse = empty({t, h}, DType::F32, Device::CUDA);
      Owned dqkv = empty(pr.qkv->shape, DType::BF16, Device::CUDA),
            dkv = empty(kv->shape, DType::BF16, Device::CUDA);
      for (const Owned* o : {&out, &lse, &dqkv, &dkv}) poison(*o);
      ops::AttentionParams p = pr.params(pr.qkv, out, lse, pr.cu);
      p.kv = kv;
      p.cu_seqlens_k = cu_k;
      p.max_seqlen_k = max_k;
      ops::attention_forward(p);
      ops::attention_backward({p, pr.dout, dqkv, dkv});

      Owned out_ref = empty({t, h, c.dim}, DType::F64, Device::CPU),
            lse_ref = empty({t, h}, DType::F64, Device::CPU);
      Owned dqkv_ref = empty(pr.qkv_ref->shape, DType::F64, Device::CPU),
            dkv_ref = empty(kv->shape, DType::F64, Device::CPU);
      ops::AttentionParams rp = pr.params(pr.qkv_ref, out_ref, lse_ref, pr.cu_host);
      rp.kv = kv_ref;
      rp.cu_seqlens_k = cu_k_host;
      rp.max_seqlen_k = max_k;
      ops::attention_forward(rp);
      ops::attention_backward({rp, pr.dout_ref, dqkv_ref, dkv_ref});

      const double e_out = check_close(out, out_ref, 1e-2, "out");
      const double e_lse = check_close(lse, lse_ref, 1e-3, "lse");
      const double e_dq = check_close(heads_of(dqkv, 0, h), heads_of(dqkv_ref, 0, h), 2e-2, "dq");
      const double e_dk = check_close(heads_of(dkv, 0, hkv), heads_of(dkv_ref, 0, hkv), 2e-2, "dk");
      const double e_dv =
          check_close(heads_of(dkv, hkv, hkv), heads_of(dkv_ref, hkv, hkv), 2e-2, "dv");
      CHECK(all_nan(heads_of(dqkv, h, 2 * hkv)));  // qkv's own k, v heads: not written
      std::printf("flash kv %-52s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", c.name().c_str(),
                  e_out, e_lse, e_dq, e_dk, e_dv);
    }
  }
}

TEST_CASE("flash attention with separate keys equal to qkv's own gives the usual results" * doctest::test_suite("gpu")) {
  // kv = qkv's k and v heads, cu_seqlens_k = cu_seqlens: the same arithmetic through other
  // pointers and strides, so out, lse, dk and dv are bitwise those of the usual call (dq up to
  // the order of its f32 atomics). Separate keys run only on the mma.sync kernels: the usual call
  // takes them too here.
  if (!engine::testing::gpu_available_or_skip()) return;
  for (const FlashCase& c :
       {FlashCase{{300, 129, 17}, 8, 2, 128, true, 0}, FlashCase{{129, 300}, 6, 3, 64, false, 40},
        FlashCase{{129, 17}, 6, 3, 16, true, 0}}) {
    SUBCASE(c.name().c_str()) {
      const Problem pr(c);
      const int64_t t = c.rows(), h = c.heads, hkv = c.kv_heads;
      const GpuResult usual = run_gpu(pr, ops::AttentionKernel::MmaSync);
      Owned kv = to_device(heads_of(pr.qkv, h, 2 * hkv), Device::CUDA, DType::BF16);
      Owned out = empty({t, h, c.dim}, DType::BF16, Device::CUDA),
            lse = empty({t, h}, DType::F32, Device::CUDA);
      Owned dqkv = empty(pr.qkv->shape, DType::BF16, Device::CUDA),
            dkv = empty(kv->shape, DType::BF16, Device::CUDA);
      ops::AttentionParams p = pr.params(pr.qkv, out, lse, pr.cu);
      p.kernel = ops::AttentionKernel::MmaSync;
      p.kv = kv;
      p.cu_seqlens_k = pr.cu;
      p.max_seqlen_k = c.max_len();
      ops::attention_forward(p);
      ops::attention_backward({p, pr.dout, dqkv, dkv});
      CHECK(bitwise_equal(out, usual.out));
      CHECK(bitwise_equal(lse, usual.lse));
      CHECK(bitwise_equal(to_device(heads_of(usual.dqkv, h, 2 * hkv), Device::CUDA, DType::BF16),
                          dkv));
      check_close(heads_of(dqkv, 0, h), heads_of(usual.dqkv, 0, h), 1e-3, "dq");
    }
  }
}

TEST_CASE("flash attention micro-sequences: chunks with their key prefix reproduce the whole batch" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  // Documents of odd lengths (one of 1 token), cut inside documents and at a document boundary
  // (38 = 37 + 1); the keys of a chunk either start at its first document (slice_varlen) or are
  // the whole prefix of the batch (documents that ended earlier: sequences without queries).
  const std::vector<int> lens = {37, 1, 300, 129, 12};
  const std::vector<std::vector<int64_t>> cuttings = {{0, 200, 479}, {0, 38, 250, 479}};
  const std::vector<FlashCase> cases = {
      {lens, 8, 2, 128, true, 0}, {lens, 4, 4, 128, true, 100}, {lens, 6, 3, 64, true, 0},
      {lens, 4, 2, 64, true, 50}, {lens, 4, 2, 32, true, 0},    {lens, 4, 4, 80, true, 30},
  };
  for (const FlashCase& c : cases) {
    SUBCASE(c.name().c_str()) {
      const Problem pr(c);
      const int64_t t = c.rows(), h = c.heads, hkv = c.kv_heads, d = c.dim;
      Owned out_ref = empty({t, h, d}, DType::F64, Device::CPU),
            lse_ref = empty({t, h}, DType::F64, Device::CPU);
      Owned dqkv_ref = empty(pr.qkv_ref->shape, DType::F64, Device::CPU);
      const ops::AttentionParams rp = pr.params(pr.qkv_ref, out_ref, lse_ref, pr.cu_host);
      ops::attention_forward(rp);
      ops::attention_backward({rp, pr.dout_ref, dqkv_ref});
      Owned kv_all = to_device(heads_of(pr.qkv, h, 2 * hkv), Device::CUDA, DType::BF16);
      for (const auto& cuts : cuttings)
        for (bool prefix : {false, true}) {
          CAPTURE(cuts.size() - 1);
          CAPTURE(prefix);
          Owned out = empty({t, h, d}, DType::BF16, Device::CUDA),
                lse = empty({t, h}, DType::F32, Device::CUDA);
          Owned dqkv = empty(pr.qkv->shape, DType::BF16, Device::CUDA);
          for (const Owned* o : {&out, &lse, &dqkv}) poison(*o);
          Owned dkv_sum = zeros({t, 2 * hkv, d}, DType::F64, Device::CPU);
          for (const AttentionChunk& ch : attention_chunks(lens, cuts, prefix)) {
            const Tensor kv = kv_all->slice(ch.key_begin, ch.end);
            Owned cu = offsets_on(ch.cu_q, Device::CUDA), cu_k = offsets_on(ch.cu_k, Device::CUDA);
            Owned dkv = empty(kv.shape, DType::BF16, Device::CUDA);
            poison(dkv);
            ops::AttentionParams p =
                pr.params(pr.qkv->slice(ch.begin, ch.end), out->slice(ch.begin, ch.end),
                          lse->slice(ch.begin, ch.end), cu);
            p.max_seqlen = ch.max_q;
            p.kv = kv;
            p.cu_seqlens_k = cu_k;
            p.max_seqlen_k = ch.max_k;
            ops::attention_forward(p);
            ops::attention_backward(
                {p, pr.dout->slice(ch.begin, ch.end), dqkv->slice(ch.begin, ch.end), dkv});
            Owned part = to_host(dkv, DType::F64);
            for (int64_t i = 0; i < part->numel(); ++i)
              dkv_sum.ptr<double>()[ch.key_begin * 2 * hkv * d + i] += part.ptr<double>()[i];
          }
          const double e_out = check_close(out, out_ref, 1e-2, "out");
          const double e_lse = check_close(lse, lse_ref, 1e-3, "lse");
          const double e_dq =
              check_close(heads_of(dqkv, 0, h), heads_of(dqkv_ref, 0, h), 2e-2, "dq");
          const double e_dk =
              check_close(heads_of(dkv_sum, 0, hkv), heads_of(dqkv_ref, h, hkv), 2e-2, "sum of dk");
          const double e_dv = check_close(heads_of(dkv_sum, hkv, hkv),
                                          heads_of(dqkv_ref, h + hkv, hkv), 2e-2, "sum of dv");
          CHECK(all_nan(heads_of(dqkv, h, 2 * hkv)));
          std::printf("flash chunks %zu%s %-44s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
                      cuts.size() - 1, prefix ? " prefix" : "", c.name().c_str(), e_out, e_lse,
                      e_dq, e_dk, e_dv);
        }
    }
  }
}

TEST_CASE("flash attention with separate keys: no queries at all zeroes dkv; argument checks" * doctest::test_suite("gpu")) {
  if (!engine::testing::gpu_available_or_skip()) return;
  const FlashCase c{{0, 0}, 4, 2, 64, true, 0};
  const Problem pr(c);  // T = 0 queries
  Owned kv = to_device(randn({9, 4, 64}, DType::F32, "flash.kv"), Device::CUDA, DType::BF16);
  Owned cu_k = offsets_on({0, 4, 9}, Device::CUDA);
  Owned out = empty({0, 4, 64}, DType::BF16, Device::CUDA),
        lse = empty({0, 4}, DType::F32, Device::CUDA);
  Owned dqkv = empty(pr.qkv->shape, DType::BF16, Device::CUDA),
        dkv = empty(kv->shape, DType::BF16, Device::CUDA);
  poison(dkv);
  ops::AttentionParams p = pr.params(pr.qkv, out, lse, pr.cu);
  p.kv = kv;
  p.cu_seqlens_k = cu_k;
  p.max_seqlen_k = 5;
  ops::attention_forward(p);
  ops::attention_backward({p, pr.dout, dqkv, dkv});
  Owned host = to_host(dkv, DType::F64);
  bool zero = true;
  for (int64_t i = 0; i < host->numel(); ++i) zero = zero && host.ptr<double>()[i] == 0.0;
  CHECK(zero);

  const Problem q(FlashCase{{5, 9}, 4, 2, 64, true, 0});
  Owned out2 = empty({14, 4, 64}, DType::BF16, Device::CUDA),
        lse2 = empty({14, 4}, DType::F32, Device::CUDA);
  Owned kv2 = empty({20, 4, 64}, DType::BF16, Device::CUDA),
        cu_k2 = offsets_on({0, 8, 20}, Device::CUDA);
  ops::AttentionParams good = q.params(q.qkv, out2, lse2, q.cu);
  good.kv = kv2;
  good.cu_seqlens_k = cu_k2;
  good.max_seqlen_k = 12;
  ops::attention_forward(good);  // accepted
  ops::AttentionParams b = good;
  b.kv = Tensor(static_cast<char*>(kv2->data) + 2, DType::BF16, Device::CUDA, {19, 4, 64});
  CHECK_THROWS_WITH_AS(ops::attention_forward(b), doctest::Contains("kv"), Error);
  Owned kv_narrow = empty({20, 4, 32}, DType::BF16, Device::CUDA);
  b = good;
  b.kv = kv_narrow;
  CHECK_THROWS_WITH_AS(ops::attention_forward(b), doctest::Contains("kv"), Error);
  b = good;
  b.max_seqlen_k = 0;
  CHECK_THROWS_WITH_AS(ops::attention_forward(b), doctest::Contains("max_seqlen_k"), Error);
  Owned dqkv2 = empty(q.qkv->shape, DType::BF16, Device::CUDA);
  CHECK_THROWS_WITH_AS(ops::attention_backward({good, q.dout, dqkv2}), doctest::Contains("dkv"),
                       Error);
  ops::AttentionParams plain = q.params(q.qkv, out2, lse2, q.cu);
  plain.max_seqlen_k = 12;
  CHECK_THROWS_WITH_AS(ops::attention_forward(plain), doctest::Contains("without kv"), Error);
}
