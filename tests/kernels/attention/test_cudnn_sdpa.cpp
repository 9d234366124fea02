// cuDNN's fused attention (cuda/attention/cudnn_sdpa, ops::AttentionBackend::Cudnn) against the
// CPU reference (csrc/ref/attention.cpp) run in f64 on the same bf16-rounded inputs, as the flash
// kernels are (test_flash.cpp: same tolerances, same reasons): out, lse and dq, dk, dv, outputs
// poisoned (NaN) first. Cases: head dims 64 and 128; GQA ratios 1, 4, 2; causal and not; windows;
// packed documents of odd lengths (1, 17, 129, 300, ...) including zero-length ones; a peaked
// softmax; separate keys (micro-sequences: the queries bottom-right aligned on their keys,
// sequences without queries). Also: the plan cache (bucketed shapes reuse plans), the lse of
// either backend feeding the backward of the other, and the argument checks. Skipped with the
// reason when there is no GPU or the binary was built without cuDNN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "tests/common/attention_case.h"
#include "tests/common/attention_checks.h"
#include "tests/common/gpu_testing.h"
#include "tests/common/testing.h"

#ifdef ENGINE_CUDA
#include "cuda/attention/cudnn_sdpa.cuh"
#endif

using namespace engine;
using namespace engine::testing;

namespace {

using Case = testing::AttentionCase;

bool cudnn_or_skip() {
  if (!gpu_available_or_skip()) return false;
#ifdef ENGINE_CUDA
  if (cuda::cudnn_built()) {
    static bool said = false;
    if (!said) std::printf("cuDNN %s\n", cuda::cudnn_version().c_str());
    said = true;
    return true;
  }
#endif
  skip_test("built without cuDNN (ENGINE_CUDNN)");
  return false;
}

// Each case builds its own cuDNN graphs (a plan per bucketed shape), which costs more than the
// attention itself: the small tier covers both head dims, causal and not, windows, GQA and
// zero-length sequences once (plain causal attention at 128 also runs in the lse and huge-dQ
// cases below); the large tier adds a long document, plain causal attention at 128 over odd
// documents, a non-causal window at 128, another causal layout at 64 and a peaked softmax.
const std::vector<Case> kCases = {
    {{300, 1, 129, 17, 64}, 8, 2, 128, false, 0},
    {{129, 300, 17}, 6, 3, 128, true, 100},
    {{64, 300, 129}, 6, 3, 64, false, 50},
    {{0, 129, 0, 64, 1, 0}, 8, 2, 64, true, 0},  // zero-length sequences around short ones
};
const std::vector<Case> kLargeCases = {
    {{1000}, 8, 2, 128, true, 0},
    {{1, 17, 64, 129, 300}, 4, 4, 128, true, 0},
    {{300, 129}, 4, 4, 128, false, 70},
    {{17, 129, 1, 300}, 4, 4, 64, true, 0},
    {{300, 17}, 8, 2, 64, true, 0, 0.5f},  // peaked softmax
};

struct Problem {
  Case c;
  Owned qkv_ref, dout_ref, cu_host;  // CPU, f64 / i32
  Owned qkv, dout, cu;               // GPU, bf16 / i32

  explicit Problem(const Case& fc) : c(fc) {
    const int64_t t = c.rows(), nh = c.heads + 2 * c.kv_heads;
    qkv = to_device(randn({t, nh, c.dim}, DType::F32, "cudnn.qkv"), Device::CUDA, DType::BF16);
    dout = to_device(randn({t, c.heads, c.dim}, DType::F32, "cudnn.dout"), Device::CUDA, DType::BF16);
    qkv_ref = to_host(qkv, DType::F64);
    dout_ref = to_host(dout, DType::F64);
    cu_host = empty({static_cast<int64_t>(c.lens.size()) + 1}, DType::I32, Device::CPU);
    int32_t* cu_p = cu_host.ptr<int32_t>();
    cu_p[0] = 0;
    for (size_t s = 0; s < c.lens.size(); ++s) cu_p[s + 1] = cu_p[s] + c.lens[s];
    cu = to_device(cu_host, Device::CUDA);
  }

  ops::AttentionParams params(const Tensor& qkv_t, const Tensor& out, const Tensor& lse, const Tensor& cu_t,
                              ops::AttentionBackend backend = ops::AttentionBackend::Cudnn) const {
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
    p.backend = backend;
    return p;
  }
};

struct Reference {
  Owned out, lse, dqkv;
};
Reference reference(const Problem& pr) {
  const int64_t t = pr.c.rows();
  Reference r{empty({t, pr.c.heads, pr.c.dim}, DType::F64, Device::CPU), empty({t, pr.c.heads}, DType::F64, Device::CPU),
              empty(pr.qkv_ref->shape, DType::F64, Device::CPU)};
  const ops::AttentionParams p = pr.params(pr.qkv_ref, r.out, r.lse, pr.cu_host);
  ops::attention_forward(p);
  ops::attention_backward({p, pr.dout_ref, r.dqkv});
  return r;
}

// forward with `fwd`, backward with `bwd`; compared with the reference.
void check_case(const Case& c, ops::AttentionBackend fwd, ops::AttentionBackend bwd, const char* label) {
  const Problem pr(c);
  const int64_t t = c.rows(), h = c.heads, hkv = c.kv_heads;
  Owned out = empty({t, h, c.dim}, DType::BF16, Device::CUDA), lse = empty({t, h}, DType::F32, Device::CUDA);
  Owned dqkv = empty(pr.qkv->shape, DType::BF16, Device::CUDA);
  for (const Owned* o : {&out, &lse, &dqkv}) poison(*o);
  ops::attention_forward(pr.params(pr.qkv, out, lse, pr.cu, fwd));
  ops::attention_backward({pr.params(pr.qkv, out, lse, pr.cu, bwd), pr.dout, dqkv});
  const Reference r = reference(pr);
  const double e_out = check_close(out, r.out, 1e-2, "out");
  const double e_lse = check_close(lse, r.lse, 1e-3, "lse");
  const double e_dq = check_close(heads_of(dqkv, 0, h), heads_of(r.dqkv, 0, h), 2e-2, "dq");
  const double e_dk = check_close(heads_of(dqkv, h, hkv), heads_of(r.dqkv, h, hkv), 2e-2, "dk");
  const double e_dv = check_close(heads_of(dqkv, h + hkv, hkv), heads_of(r.dqkv, h + hkv, hkv), 2e-2, "dv");
  std::printf("%s %-62s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", label, c.name().c_str(), e_out, e_lse, e_dq,
              e_dk, e_dv);
}

}  // namespace

namespace {
void reference_sweep(const std::vector<Case>& cases) {
  if (!cudnn_or_skip()) return;
  for (const Case& c : cases) {
    SUBCASE(c.name().c_str()) { check_case(c, ops::AttentionBackend::Cudnn, ops::AttentionBackend::Cudnn, "cudnn"); }
  }
}
}  // namespace
GPU_TEST_SWEEP("cudnn attention forward and backward match the f64 reference (bf16 inputs)", reference_sweep,
               kCases, kLargeCases)

TEST_CASE("cudnn and flash attention: the lse of either feeds the backward of the other" * doctest::test_suite("gpu")) {
  if (!cudnn_or_skip()) return;
  const Case c{{129, 300, 17}, 8, 2, 128, true, 0};
  check_case(c, ops::AttentionBackend::Cudnn, ops::AttentionBackend::Flash, "cudnn fwd, flash bwd");
  check_case(c, ops::AttentionBackend::Flash, ops::AttentionBackend::Cudnn, "flash fwd, cudnn bwd");
}

TEST_CASE("cudnn attention builds its plans once per bucketed shape" * doctest::test_suite("gpu")) {
  if (!cudnn_or_skip()) return;
#ifdef ENGINE_CUDA
  // 3 then 4 sequences (bucket 4), longest 100 then 120 (bucket 128): one forward and one
  // backward plan between them; 5 sequences (bucket 8) build two more.
  const Case a{{100, 50, 3}, 4, 2, 64, true, 0}, b{{90, 120, 7, 1}, 4, 2, 64, true, 0},
      c{{90, 120, 7, 1, 33}, 4, 2, 64, true, 0};
  check_case(a, ops::AttentionBackend::Cudnn, ops::AttentionBackend::Cudnn, "cudnn");
  const int after_a = cuda::cudnn_attention_plans_built();
  check_case(b, ops::AttentionBackend::Cudnn, ops::AttentionBackend::Cudnn, "cudnn");
  CHECK(cuda::cudnn_attention_plans_built() == after_a);
  check_case(c, ops::AttentionBackend::Cudnn, ops::AttentionBackend::Cudnn, "cudnn");
  CHECK(cuda::cudnn_attention_plans_built() == after_a + 2);
#endif
}

namespace {
// Forward and backward of one backend on pr's inputs (fresh poisoned outputs).
struct Run {
  Owned out, lse, dqkv;
};
Run run_backend(const Problem& pr, ops::AttentionBackend backend, int window) {
  const int64_t t = pr.c.rows();
  Run r{empty({t, pr.c.heads, pr.c.dim}, DType::BF16, Device::CUDA), empty({t, pr.c.heads}, DType::F32, Device::CUDA),
        empty(pr.qkv->shape, DType::BF16, Device::CUDA)};
  poison(r.out);
  poison(r.lse);
  poison(r.dqkv);
  ops::AttentionParams p = pr.params(pr.qkv, r.out, r.lse, pr.cu, backend);
  p.window = window;
  ops::attention_forward(p);
  ops::attention_backward({p, pr.dout, r.dqkv});
  return r;
}
}  // namespace

TEST_CASE("attention: a window at least as long as every sequence equals no window, INT_MAX included" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  // The kernels' tile arithmetic is 32-bit: first key + tile + window overflowed for INT_MAX and
  // zeroed the gradients; ops clamps such windows to 0 (unlimited).
  const Problem pr(Case{{300, 129, 17}, 4, 2, 128, true, 0});
  std::vector<ops::AttentionBackend> backends = {ops::AttentionBackend::Flash};
#ifdef ENGINE_CUDA
  if (cuda::cudnn_built()) backends.push_back(ops::AttentionBackend::Cudnn);
#endif
  for (ops::AttentionBackend be : backends) {
    CAPTURE(static_cast<int>(be));
    const Run none = run_backend(pr, be, 0);
    for (int window : {300, 1 << 30, std::numeric_limits<int>::max()}) {
      CAPTURE(window);
      const Run w = run_backend(pr, be, window);
      CHECK(bitwise_equal(w.out, none.out));
      CHECK(bitwise_equal(w.lse, none.lse));
      check_close(w.dqkv, to_host(none.dqkv, DType::F64), 1e-2, "dqkv");  // dq: atomics order
    }
  }
}

TEST_CASE("cudnn attention: a micro-batch whose dense dQ accumulator would be huge runs the flash backward" * doctest::test_suite("gpu")) {
  if (!cudnn_or_skip()) return;
  // 64 sequences (bucket 64), the longest 4096 (bucket 4096): cuDNN's accumulator would be
  // 64 x 16 x 4096 x 128 x 4 bytes = 2 GiB for 5104 rows (42 MB of f32 rows).
  std::vector<int> lens(63, 16);
  lens.push_back(4096);
  const Problem pr(Case{lens, 16, 8, 128, true, 0});
  const Run flash = run_backend(pr, ops::AttentionBackend::Flash, 0);
  const Run cudnn = run_backend(pr, ops::AttentionBackend::Cudnn, 0);
  check_close(cudnn.out, to_host(flash.out, DType::F64), 1e-2, "out");
  check_close(cudnn.lse, to_host(flash.lse, DType::F64), 1e-5, "lse");
  check_close(cudnn.dqkv, to_host(flash.dqkv, DType::F64), 2e-2, "dqkv");
}

TEST_CASE("cudnn attention rejects what cuDNN cannot run, naming it" * doctest::test_suite("gpu")) {
  if (!cudnn_or_skip()) return;
  const Problem pr(Case{{5, 9}, 4, 2, 64, true, 0});
  Owned out = empty({14, 4, 64}, DType::BF16, Device::CUDA), lse = empty({14, 4}, DType::F32, Device::CUDA);
  const ops::AttentionParams good = pr.params(pr.qkv, out, lse, pr.cu);
  ops::attention_forward(good);
  ops::AttentionParams p = good;
  Owned qkv_f32 = to_device(to_host(pr.qkv, DType::F32), Device::CUDA);
  p.qkv = qkv_f32;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("bf16"), Error);
  Owned odd = empty({14, 8, 20}, DType::BF16, Device::CUDA), odd_out = empty({14, 4, 20}, DType::BF16, Device::CUDA);
  p = good;
  p.qkv = odd;
  p.out = odd_out;
  p.head_dim = 20;
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("head_dim"), Error);
  Owned big = empty({15, 8, 64}, DType::BF16, Device::CUDA);
  p = good;
  p.qkv = Tensor(static_cast<char*>(big->data) + 2, DType::BF16, Device::CUDA, {14, 8, 64});
  CHECK_THROWS_WITH_AS(ops::attention_forward(p), doctest::Contains("aligned"), Error);
}

// ---- Separate keys (micro-sequences) -------------------------------------------------------------

namespace {

Owned offsets_on(const std::vector<int>& lens, Device dev) {
  Owned host = empty({static_cast<int64_t>(lens.size()) + 1}, DType::I32, Device::CPU);
  host.ptr<int32_t>()[0] = 0;
  for (size_t s = 0; s < lens.size(); ++s) host.ptr<int32_t>()[s + 1] = host.ptr<int32_t>()[s] + lens[s];
  return dev == Device::CPU ? std::move(host) : to_device(host, dev);
}

struct KvCase {
  Case c;                   // c.lens: queries per sequence
  std::vector<int> lens_k;  // keys per sequence (>= queries; the queries are the last ones)
};
const std::vector<KvCase> kKvCases = {
    {{{1, 200, 0, 130}, 8, 2, 128, true, 0}, {300, 200, 64, 517}},  // no queries: dK = dV = 0
    {{{129, 1, 70}, 6, 3, 128, true, 60}, {700, 129, 300}},  // keys older than every window
    {{{17, 0, 40}, 6, 2, 64, false, 20}, {80, 33, 40}},
};
const std::vector<KvCase> kLargeKvCases = {  // the gpu-slow tier
    {{{65, 3}, 4, 4, 128, false, 0}, {65, 400}},
    {{{129, 1}, 6, 3, 64, true, 100}, {700, 129}},
};

void separate_keys_sweep(const std::vector<KvCase>& cases) {
  if (!cudnn_or_skip()) return;
  for (const KvCase& kc : cases) {
    SUBCASE(kc.c.name().c_str()) {
      const Case& c = kc.c;
      const Problem pr(c);
      const int64_t t = c.rows(), h = c.heads, hkv = c.kv_heads;
      const int64_t tk = std::accumulate(kc.lens_k.begin(), kc.lens_k.end(), int64_t{0});
      Owned kv = to_device(randn({tk, 2 * hkv, c.dim}, DType::F32, "cudnn.kv"), Device::CUDA, DType::BF16);
      Owned kv_ref = to_host(kv, DType::F64);
      Owned cu_k = offsets_on(kc.lens_k, Device::CUDA), cu_k_host = offsets_on(kc.lens_k, Device::CPU);
      const int max_k = *std::max_element(kc.lens_k.begin(), kc.lens_k.end());

      Owned out = empty({t, h, c.dim}, DType::BF16, Device::CUDA), lse = empty({t, h}, DType::F32, Device::CUDA);
      Owned dqkv = empty(pr.qkv->shape, DType::BF16, Device::CUDA), dkv = empty(kv->shape, DType::BF16, Device::CUDA);
      for (const Owned* o : {&out, &lse, &dqkv, &dkv}) poison(*o);
      ops::AttentionParams p = pr.params(pr.qkv, out, lse, pr.cu);
      p.kv = kv;
      p.cu_seqlens_k = cu_k;
      p.max_seqlen_k = max_k;
      ops::attention_forward(p);
      ops::attention_backward({p, pr.dout, dqkv, dkv});

      Owned out_ref = empty({t, h, c.dim}, DType::F64, Device::CPU), lse_ref = empty({t, h}, DType::F64, Device::CPU);
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
      const double e_dv = check_close(heads_of(dkv, hkv, hkv), heads_of(dkv_ref, hkv, hkv), 2e-2, "dv");
      CHECK(all_nan(heads_of(dqkv, h, 2 * hkv)));  // qkv's own k, v heads: not written
      std::printf("cudnn kv %-52s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", c.name().c_str(), e_out, e_lse, e_dq,
                  e_dk, e_dv);
    }
  }
}

}  // namespace

GPU_TEST_SWEEP("cudnn attention with separate keys matches the f64 reference", separate_keys_sweep, kKvCases,
               kLargeKvCases)
