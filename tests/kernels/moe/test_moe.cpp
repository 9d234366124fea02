// GPU tests of cuda/moe against the f64 CPU reference (csrc/ref/moe.cpp): routing (ties, k = 1
// and 2, probs in place over the logits), aux / z losses and the route backward (bf16 and f32
// dlogits), dispatch (bit-exact counts, offsets and rows on skewed routing, empty experts, many
// chunks, E above a block's threads), permute / unpermute and backward (bf16 and f32, vector and
// element paths, misaligned views), the grouped GEMMs (forward, input and weight gradients,
// one and two weight stacks, empty experts, partial tiles, padding rows left untouched; each on
// the Portable and, on sm_90, the Hopper kernels) against the reference and against a loop of
// cuBLASLt GEMMs (ops::matmul) per expert, and the jitter.
// Tolerances: bf16 outputs within bf16_tol (twice the rounding error of the exact result);
// f32 outputs of sums of bf16 products 1e-5; routing f32 1e-5.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/gemm.h"
#include "ops/moe.h"
#include "tests/common/gpu_testing.h"

#ifdef ENGINE_CUDA
#include "cuda/moe/moe.cuh"
#endif

using namespace engine;
using namespace engine::testing;

namespace {

constexpr double kF32Tol = 1e-5;

// Expert ids (T, k): distinct per token; `hot` (>= 0) gets 7 in 8 draws when free; the experts
// in `empties` are never used.
Owned assignment(int64_t T, int64_t k, int64_t E, int hot, const std::vector<int>& empties,
                 const std::string& name) {
  Owned idx = empty({T, k}, DType::I32, Device::CPU);
  Owned u = randint({std::max<int64_t>(T, 1), k, 2}, 0, 1 << 30, name);
  std::vector<int> allowed;
  for (int e = 0; e < E; ++e)
    if (std::find(empties.begin(), empties.end(), e) == empties.end()) allowed.push_back(e);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> pool = allowed;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t* r = u.ptr<int32_t>() + (t * k + j) * 2;
      size_t pick = static_cast<size_t>(r[0]) % pool.size();
      if (hot >= 0 && r[1] % 8 != 0) {
        auto it = std::find(pool.begin(), pool.end(), hot);
        if (it != pool.end()) pick = static_cast<size_t>(it - pool.begin());
      }
      idx.ptr<int32_t>()[t * k + j] = pool[pick];
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  return idx;
}

// Host offsets (E + 1) and counts (E) laid out as moe_dispatch does.
struct Layout {
  Owned counts, offsets;
  int64_t rows = 0;  // offsets_E
};
[[maybe_unused]] Layout layout_of(const std::vector<int32_t>& counts) {
  const int64_t E = static_cast<int64_t>(counts.size());
  Layout l;
  l.counts = empty({E}, DType::I32, Device::CPU);
  l.offsets = empty({E + 1}, DType::I32, Device::CPU);
  l.offsets.ptr<int32_t>()[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    l.counts.ptr<int32_t>()[e] = counts[e];
    l.offsets.ptr<int32_t>()[e + 1] = static_cast<int32_t>(
        l.offsets.ptr<int32_t>()[e] +
        (counts[e] + ops::kMoeRowAlign - 1) / ops::kMoeRowAlign * ops::kMoeRowAlign);
  }
  l.rows = l.offsets.ptr<int32_t>()[E];
  return l;
}

// The rows of `t` (R, C) owned by some expert, stacked (f64 on the host).
[[maybe_unused]] Owned owned_rows(const Tensor& t, const Layout& l) {
  Owned h = to_host(t, DType::F64);
  const int64_t E = l.counts->numel(), C = t.size(1);
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) n += l.counts.ptr<int32_t>()[e];
  Owned out = empty({n, C}, DType::F64, Device::CPU);
  int64_t i = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = l.offsets.ptr<int32_t>()[e]; r < l.offsets.ptr<int32_t>()[e] + l.counts.ptr<int32_t>()[e]; ++r, ++i)
      std::copy(h.ptr<double>() + r * C, h.ptr<double>() + (r + 1) * C, out.ptr<double>() + i * C);
  return out;
}

// True when every row of `t` outside the experts' ranges still holds the poison (NaN).
[[maybe_unused]] bool padding_untouched(const Tensor& t, const Layout& l) {
  Owned h = to_host(t, DType::F64);
  const int64_t R = t.size(0), C = t.size(1), E = l.counts->numel();
  std::vector<bool> owned(R, false);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = l.offsets.ptr<int32_t>()[e]; r < l.offsets.ptr<int32_t>()[e] + l.counts.ptr<int32_t>()[e]; ++r)
      owned[r] = true;
  for (int64_t r = 0; r < R; ++r)
    if (!owned[r])
      for (int64_t c = 0; c < C; ++c)
        if (!std::isnan(h.ptr<double>()[r * C + c])) return false;
  return true;
}

#ifdef ENGINE_CUDA
// The grouped linear kernels this device runs (ops::GroupedLinearOptions::kernel): Portable
// (mma.sync) always; Hopper on sm_90 (the TMA wgmma kernel; the forward of weight stacks with
// N/S % 64 != 0 on the cp.async wgmma kernel, their dgrad on mma.sync).
std::vector<ops::GroupedKernel> grouped_kernels() {
  std::vector<ops::GroupedKernel> k = {ops::GroupedKernel::Portable};
  if (cuda::grouped_hopper_available()) k.push_back(ops::GroupedKernel::Hopper);
  else MESSAGE("no Hopper grouped kernels on this device: the portable one only");
  return k;
}
#endif

struct GemmCase {
  const char* name;
  std::vector<int32_t> counts;
  int64_t stacks, n, k;  // N over all stacks
};
const std::vector<GemmCase> kGemmCases = {
    {"balanced 3 x 128, N 256, K 128", {128, 128, 128}, 1, 256, 128},
    {"skewed with an empty expert, partial tiles", {300, 0, 7, 129, 1}, 1, 200, 72},
    {"one hot expert", {1000, 3, 0, 20}, 1, 136, 264},
    // N/S % 64 != 0: the Hopper forward on the cp.async wgmma kernel, the dgrad on mma.sync.
    {"two stacks of 100 rows (gate | up)", {77, 0, 250}, 2, 200, 128},
    {"all experts empty", {0, 0, 0}, 1, 64, 64},
    {"K smaller than a k step", {5, 140}, 1, 24, 8},
    {"two stacks of 192 (TMA), K tail, skewed", {300, 0, 5, 129}, 2, 384, 72},
    {"N 320: a partial B tile (TMA), K 136", {1000, 3, 0, 20}, 1, 320, 136},
    {"leading and trailing empty experts", {0, 300, 129, 0}, 1, 256, 128},
    {"counts multiples of 64, not of 128", {64, 192, 64}, 1, 256, 192},
};
// The gpu-slow tier: more work units than the TMA kernel's clusters, on two stacks (N/S % 64 == 0).
const std::vector<GemmCase> kLargeGemmCases = {
    {"two stacks, persistent", {2000, 0, 1300, 700, 1}, 2, 1536, 1152},
};

}  // namespace

TEST_CASE("cuda moe routing: top-k, probabilities, weights, in place, ties" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t T, E, k;
  };
  for (const Case& c : std::vector<Case>{{333, 8, 2}, {333, 8, 1}, {97, 37, 2}, {51, 300, 2},
                                         {1, 1, 1}, {2000, 64, 8}}) {
    CAPTURE(c.T);
    CAPTURE(c.E);
    CAPTURE(c.k);
    Owned logits = randn({c.T, c.E}, DType::F32, "route.logits", 2.0);
    if (c.T > 10)  // exact ties on a few rows
      for (int64_t e = 0; e < c.E; ++e) logits.ptr<float>()[3 * c.E + e] = 0.5f;
    auto [gl, l64] = device_input(logits, DType::F32);
    Owned p64 = empty({c.T, c.E}, DType::F64, Device::CPU), lse64 = empty({c.T}, DType::F64, Device::CPU);
    Owned idx_ref = empty({c.T, c.k}, DType::I32, Device::CPU), w64 = empty({c.T, c.k}, DType::F64, Device::CPU);
    for (const bool renorm : {true, false}) {  // Mixtral's renormalised weights, Qwen2-MoE's raw
      CAPTURE(renorm);
      ref::moe_route_forward(l64, p64, lse64, idx_ref, w64, renorm);
      DeviceTensor gp = gpu_poisoned({c.T, c.E}, DType::F32), glse = gpu_poisoned({c.T}, DType::F32);
      DeviceTensor gidx = gpu_poisoned({c.T, c.k}, DType::I32), gw = gpu_poisoned({c.T, c.k}, DType::F32);
      ops::moe_route_forward(gl.t, gp.t, glse.t, gidx.t, gw.t, renorm);
      Owned idx = to_host(gidx.t, DType::I32);
      CHECK(std::memcmp(idx->data, idx_ref->data, idx->nbytes()) == 0);
      CHECK_CLOSE(gp.t, p64.t, kF32Tol);
      CHECK_CLOSE(glse.t, lse64.t, kF32Tol);
      CHECK_CLOSE(gw.t, w64.t, kF32Tol);
    }
    DeviceTensor gp = gpu_poisoned({c.T, c.E}, DType::F32), glse = gpu_poisoned({c.T}, DType::F32);
    DeviceTensor gidx = gpu_poisoned({c.T, c.k}, DType::I32), gw = gpu_poisoned({c.T, c.k}, DType::F32);
    ops::moe_route_forward(gl.t, gp.t, glse.t, gidx.t, gw.t, true);
    ops::moe_route_forward(gl.t, gl.t, glse.t, gidx.t, gw.t, true);  // probs over the logits
    CHECK(bitwise_equal(gl.t, gp.t));
  }
}

TEST_CASE("cuda moe aux losses and route backward match the f64 reference" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t T, E, k;
    float aux, z, scale;
  };
  for (const Case& c : std::vector<Case>{{333, 8, 2, 0.01f, 0.001f, 1.f}, {97, 37, 1, 0.3f, 0.2f, 0.5f},
                                         {1500, 300, 2, 0.1f, 0.f, 2.f}, {5, 1, 1, 0.2f, 0.3f, 1.f}}) {
    CAPTURE(c.T);
    CAPTURE(c.E);
    CAPTURE(c.k);
    const ops::MoeAuxCoefs coefs{c.aux, c.z};
    Owned logits = randn({c.T, c.E}, DType::F32, "rb.logits", 1.5);
    Owned dw = randn({c.T, c.k}, DType::F32, "rb.dw");
    auto [gl, l64] = device_input(logits, DType::F32);
    auto [gdw, dw64] = device_input(dw, DType::F32);
    // Device routing, then the reference on the device's own probs / lse / choice.
    DeviceTensor gp = gpu_empty({c.T, c.E}, DType::F32), glse = gpu_empty({c.T}, DType::F32);
    DeviceTensor gidx = gpu_empty({c.T, c.k}, DType::I32), gw = gpu_empty({c.T, c.k}, DType::F32);
    DeviceTensor gcounts = gpu_poisoned({c.E}, DType::I32), goff = gpu_poisoned({c.E + 1}, DType::I32);
    DeviceTensor grow = gpu_poisoned({c.T, c.k}, DType::I32);
    ops::moe_route_forward(gl.t, gp.t, glse.t, gidx.t, gw.t, true);
    ops::moe_dispatch(gidx.t, gcounts.t, goff.t, grow.t);
    Owned p64 = to_host(gp.t, DType::F64), lse64 = to_host(glse.t, DType::F64);
    Owned w64 = to_host(gw.t, DType::F64), idx = to_host(gidx.t, DType::I32);
    Owned counts = to_host(gcounts.t, DType::I32);

    Owned losses64 = empty({2}, DType::F64, Device::CPU);
    ref::moe_aux_losses(p64, lse64, counts, coefs, losses64);
    DeviceTensor glosses = gpu_poisoned({2}, DType::F32);
    ops::moe_aux_losses(gp.t, glse.t, gcounts.t, coefs, glosses.t);
    Owned losses = to_host(glosses.t, DType::F64);
    for (int i = 0; i < 2; ++i)
      CHECK(get(losses, i) == doctest::Approx(get(losses64, i)).epsilon(1e-5));

    // renorm false: the weights' gradient without the renormalisation (the same choice and
    // probabilities; the weights tensor is read only by the renormalised form).
    for (const bool renorm : {true, false}) {
      CAPTURE(renorm);
      Owned dl64 = empty({c.T, c.E}, DType::F64, Device::CPU);
      ref::moe_route_backward(dw64, p64, lse64, idx, w64, counts, coefs, c.scale, renorm, dl64);
      for (DType dt : {DType::F32, DType::BF16}) {
        INFO(dtype_name(dt));
        DeviceTensor gdl = gpu_poisoned({c.T, c.E}, dt);
        ops::moe_route_backward(gdw.t, gp.t, glse.t, gidx.t, gw.t, gcounts.t, coefs, c.scale, renorm,
                                gdl.t);
        CHECK_CLOSE(gdl.t, dl64.t, output_tol(dt, dl64, 1e-4));
      }
    }
  }
}

TEST_CASE("cuda moe dispatch: bit-exact counts, offsets and stable rows" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t T, E, k;
    int hot;
    std::vector<int> empties;
  };
  const std::vector<Case> cases = {{333, 8, 2, -1, {}},       {3001, 8, 2, 0, {5}},
                                   {3001, 8, 1, 6, {0, 1}},   {700, 300, 2, 299, {7}},
                                   {1, 4, 2, -1, {}},         {0, 4, 2, -1, {}},
                                   {5000, 1, 1, -1, {}},      {2049, 1000, 8, -1, {}}};
  for (const Case& c : cases) {
    CAPTURE(c.T);
    CAPTURE(c.E);
    CAPTURE(c.k);
    Owned idx = assignment(c.T, c.k, c.E, c.hot, c.empties, "dispatch");
    Owned counts = empty({c.E}, DType::I32, Device::CPU), offsets = empty({c.E + 1}, DType::I32, Device::CPU);
    Owned row_of = empty({c.T, c.k}, DType::I32, Device::CPU);
    ref::moe_dispatch(idx, counts, offsets, row_of);
    DeviceTensor gidx = to_gpu(idx);
    DeviceTensor gc = gpu_poisoned({c.E}, DType::I32), go = gpu_poisoned({c.E + 1}, DType::I32);
    DeviceTensor gr = gpu_poisoned({c.T, c.k}, DType::I32);
    ops::moe_dispatch(gidx.t, gc.t, go.t, gr.t);
    CHECK(bitwise_equal(gc.t, counts));
    CHECK(bitwise_equal(go.t, offsets));
    CHECK(bitwise_equal(gr.t, row_of));
  }
}

TEST_CASE("cuda moe permute, unpermute and its backward match the reference" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  struct Case {
    int64_t T, E, k, C, offset;
  };
  for (const Case& c : std::vector<Case>{{301, 8, 2, 64, 0}, {97, 5, 1, 37, 0}, {50, 3, 2, 4096, 0},
                                         {33, 6, 2, 40, 1}, {1, 2, 2, 8, 0}}) {
    for (DType dt : {DType::BF16, DType::F32}) {
      CAPTURE(c.T);
      CAPTURE(c.C);
      CAPTURE(c.k);
      CAPTURE(c.offset);
      INFO(dtype_name(dt));
      Owned idx = assignment(c.T, c.k, c.E, 0, {}, "perm");
      Owned counts = empty({c.E}, DType::I32, Device::CPU), offsets = empty({c.E + 1}, DType::I32, Device::CPU);
      Owned row_of = empty({c.T, c.k}, DType::I32, Device::CPU);
      ref::moe_dispatch(idx, counts, offsets, row_of);
      const int64_t R = ops::moe_permuted_rows(c.T, c.k, c.E);
      DeviceTensor grow = to_gpu(row_of);
      Owned x = randn({c.T, c.C}, DType::F32, "perm.x");
      auto [gx, x64] = device_input(x, dt, c.offset);
      // permute: the used rows hold x's rows, the rest stays poisoned
      DeviceTensor gxp = gpu_poisoned({R, c.C}, dt, c.offset);
      ops::moe_permute(gx.t, grow.t, gxp.t);
      Owned xp64 = empty({R, c.C}, DType::F64, Device::CPU);
      poison(xp64);
      ref::moe_permute(x64, row_of, xp64);
      Owned got = to_host(gxp.t, DType::F64);
      bool same = true;
      for (int64_t i = 0; i < R * c.C; ++i) {
        const double a = get(got, i), b = get(xp64, i);
        same &= (std::isnan(a) && std::isnan(b)) || a == b;
      }
      CHECK(same);
      // unpermute with and without weights
      Owned yp = randn({R, c.C}, DType::F32, "perm.yp"), w = randn({c.T, c.k}, DType::F32, "perm.w");
      auto [gyp, yp64] = device_input(yp, dt, c.offset);
      auto [gw, w64] = device_input(w, DType::F32);
      Owned y64 = empty({c.T, c.C}, DType::F64, Device::CPU);
      for (bool weighted : {true, false}) {
        INFO(weighted);
        ref::moe_unpermute(yp64, row_of, weighted ? w64.t : Tensor{}, y64);
        DeviceTensor gy = gpu_poisoned({c.T, c.C}, dt, c.offset);
        ops::moe_unpermute(gyp.t, grow.t, weighted ? gw.t : Tensor{}, gy.t);
        CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, kF32Tol));
      }
      // backward: scatter of w dy and the dot products
      Owned dy = randn({c.T, c.C}, DType::F32, "perm.dy");
      auto [gdy, dy64] = device_input(dy, dt, c.offset);
      Owned dyp64 = empty({R, c.C}, DType::F64, Device::CPU), dw64 = empty({c.T, c.k}, DType::F64, Device::CPU);
      poison(dyp64);
      ref::moe_unpermute_backward(dy64, yp64, row_of, w64, dyp64, dw64);
      DeviceTensor gdyp = gpu_poisoned({R, c.C}, dt, c.offset), gdw = gpu_poisoned({c.T, c.k}, DType::F32);
      ops::moe_unpermute_backward(gdy.t, gyp.t, grow.t, gw.t, gdyp.t, gdw.t);
      CHECK_CLOSE(gdw.t, dw64.t, 1e-5);
      // compare the written rows (the rest must stay poisoned)
      Owned hd = to_host(gdyp.t, DType::F64);
      int64_t wrong_poison = 0;
      std::vector<double> a, b;
      for (int64_t i = 0; i < R * c.C; ++i) {
        if (std::isnan(get(dyp64, i))) {
          wrong_poison += !std::isnan(get(hd, i));
        } else {
          a.push_back(get(hd, i));
          b.push_back(get(dyp64, i));
        }
      }
      CHECK(wrong_poison == 0);
      Owned ta = empty({static_cast<int64_t>(a.size())}, DType::F64, Device::CPU), tb = empty(ta->shape, DType::F64, Device::CPU);
      std::copy(a.begin(), a.end(), ta.ptr<double>());
      std::copy(b.begin(), b.end(), tb.ptr<double>());
      CHECK_CLOSE(ta.t, tb.t, output_tol(dt, tb, kF32Tol));
    }
  }
}

#ifdef ENGINE_CUDA  // the kernel choice is a CUDA-only switch
namespace {
void grouped_linear_sweep(const std::vector<GemmCase>& cases) {
  if (!gpu_available_or_skip()) return;
  for (const GemmCase& c : cases) {
    SUBCASE(c.name) {
      const int64_t E = static_cast<int64_t>(c.counts.size());
      Layout l = layout_of(c.counts);
      const int64_t R = l.rows + 130;  // room past offsets_E, as the static bound leaves
      const Shape wshape = c.stacks == 1 ? Shape{E, c.n, c.k} : Shape{c.stacks, E, c.n / c.stacks, c.k};
      DeviceTensor goff = to_gpu(l.offsets), gcnt = to_gpu(l.counts);
      auto [gx, x64] = device_input(randn({R, c.k}, DType::F32, "gg.x"), DType::BF16);
      auto [gw, w64] = device_input(randn(wshape, DType::F32, "gg.w", 0.1), DType::BF16);
      auto [gdy, dy64] = device_input(randn({R, c.n}, DType::F32, "gg.dy"), DType::BF16);
      // forward
      Owned y64 = empty({R, c.n}, DType::F64, Device::CPU);
      ref::grouped_linear_forward(x64, w64, l.offsets, l.counts, y64, {});
      Owned yref = owned_rows(y64, l);
      for (ops::GroupedKernel kernel : grouped_kernels()) {
        INFO("forward kernel " << static_cast<int>(kernel));
        DeviceTensor gy = gpu_poisoned({R, c.n}, DType::BF16);
        ops::grouped_linear_forward(gx.t, gw.t, goff.t, gcnt.t, gy.t, {kernel});
        CHECK_CLOSE(owned_rows(gy.t, l).t, yref.t, bf16_tol(yref));
        CHECK(padding_untouched(gy.t, l));
      }
      // input gradient
      Owned dx64 = empty({R, c.k}, DType::F64, Device::CPU);
      ref::grouped_linear_backward_input(dy64, w64, l.offsets, l.counts, dx64, {});
      Owned dxref = owned_rows(dx64, l);
      for (ops::GroupedKernel kernel : grouped_kernels()) {
        INFO("dgrad kernel " << static_cast<int>(kernel));
        DeviceTensor gdx = gpu_poisoned({R, c.k}, DType::BF16);
        ops::grouped_linear_backward_input(gdy.t, gw.t, goff.t, gcnt.t, gdx.t, {kernel});
        CHECK_CLOSE(owned_rows(gdx.t, l).t, dxref.t, bf16_tol(dxref));
        CHECK(padding_untouched(gdx.t, l));
      }
      // weight gradient, accumulated onto random f32 values; twice gives the same bits
      Owned dw0 = randn(wshape, DType::F32, "gg.dw0");
      Owned dw64 = to_host(dw0, DType::F64);
      ref::grouped_linear_backward_weight(dy64, x64, l.offsets, l.counts, dw64, {});
      for (ops::GroupedKernel kernel : grouped_kernels()) {
        INFO("wgrad kernel " << static_cast<int>(kernel));
        DeviceTensor gdw = to_gpu(dw0), gdw2 = to_gpu(dw0);
        ops::grouped_linear_backward_weight(gdy.t, gx.t, goff.t, gcnt.t, gdw.t, {kernel});
        ops::grouped_linear_backward_weight(gdy.t, gx.t, goff.t, gcnt.t, gdw2.t, {kernel});
        CHECK_CLOSE(gdw.t, dw64.t, kF32Tol);
        CHECK(bitwise_equal(gdw.t, gdw2.t));
      }
    }
  }
}
}  // namespace
GPU_TEST_SWEEP("cuda grouped linear matches the f64 reference: forward, dgrad, wgrad (+=)",
               grouped_linear_sweep, kGemmCases, kLargeGemmCases)

// Every kernel against a loop of cuBLASLt GEMMs over the experts (one stack).
static void check_against_cublas(const std::vector<int32_t>& counts, int64_t N, int64_t K) {
  const int64_t E = static_cast<int64_t>(counts.size());
  Layout l = layout_of(counts);
  const int64_t R = l.rows;
  DeviceTensor goff = to_gpu(l.offsets), gcnt = to_gpu(l.counts);
  DeviceTensor gx = to_gpu(randn({R, K}, DType::F32, "cb.x"), DType::BF16);
  DeviceTensor gw = to_gpu(randn({E, N, K}, DType::F32, "cb.w", 0.05), DType::BF16);
  DeviceTensor gdy = to_gpu(randn({R, N}, DType::F32, "cb.dy"), DType::BF16);
  DeviceTensor gy = gpu_poisoned({R, N}, DType::BF16), gy_ref = gpu_poisoned({R, N}, DType::BF16);
  DeviceTensor gdx = gpu_poisoned({R, K}, DType::BF16), gdx_ref = gpu_poisoned({R, K}, DType::BF16);
  DeviceTensor gdw_ref = to_gpu(zeros({E, N, K}, DType::F32, Device::CPU));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = l.offsets.ptr<int32_t>()[e], n = counts[e];
    if (n == 0) continue;
    const Tensor we = gw.t.slice(e, e + 1).view({N, K}), dwe = gdw_ref.t.slice(e, e + 1).view({N, K});
    ops::matmul(gx.t.slice(r0, r0 + n), false, we, true, gy_ref.t.slice(r0, r0 + n), {});
    ops::matmul(gdy.t.slice(r0, r0 + n), false, we, false, gdx_ref.t.slice(r0, r0 + n), {});
    ops::matmul(gdy.t.slice(r0, r0 + n), true, gx.t.slice(r0, r0 + n), false, dwe, {1.f, 1.f, {}});
  }
  Owned yr = owned_rows(gy_ref.t, l), dxr = owned_rows(gdx_ref.t, l);
  for (ops::GroupedKernel kernel : grouped_kernels()) {
    INFO("forward kernel " << static_cast<int>(kernel));
    poison(gy.t);
    ops::grouped_linear_forward(gx.t, gw.t, goff.t, gcnt.t, gy.t, {kernel});
    CHECK_CLOSE(owned_rows(gy.t, l).t, yr.t, 1e-2);
  }
  for (ops::GroupedKernel kernel : grouped_kernels()) {
    INFO("dgrad kernel " << static_cast<int>(kernel));
    poison(gdx.t);
    ops::grouped_linear_backward_input(gdy.t, gw.t, goff.t, gcnt.t, gdx.t, {kernel});
    CHECK_CLOSE(owned_rows(gdx.t, l).t, dxr.t, 1e-2);
  }
  const Owned dw_ref = to_host(gdw_ref.t, DType::F64);
  for (ops::GroupedKernel kernel : grouped_kernels()) {
    INFO("wgrad kernel " << static_cast<int>(kernel));
    DeviceTensor dw = to_gpu(zeros({E, N, K}, DType::F32, Device::CPU));
    ops::grouped_linear_backward_weight(gdy.t, gx.t, goff.t, gcnt.t, dw.t, {kernel});
    CHECK_CLOSE(dw.t, dw_ref.t, 1e-5);
  }
}

TEST_CASE("cuda grouped linear: NaN in the rows past each expert's count never reaches y, dx or dW" * doctest::test_suite("gpu")) {
  // moe_dispatch leaves the padding rows of the permuted layout unwritten: whatever they hold
  // must not enter a product (zero fill where a tile reads them), on every kernel (case 3: the
  // cp.async wgmma forward on Hopper).
  if (!gpu_available_or_skip()) return;
  for (const GemmCase& c : {kGemmCases[1], kGemmCases[3], kGemmCases[6], kGemmCases[9]}) {
    SUBCASE(c.name) {
      const int64_t E = static_cast<int64_t>(c.counts.size());
      Layout l = layout_of(c.counts);
      const int64_t R = l.rows + 130;
      const Shape wshape = c.stacks == 1 ? Shape{E, c.n, c.k} : Shape{c.stacks, E, c.n / c.stacks, c.k};
      Owned x = randn({R, c.k}, DType::F32, "nan.x"), dy = randn({R, c.n}, DType::F32, "nan.dy");
      std::vector<bool> owned(static_cast<size_t>(R), false);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = l.offsets.ptr<int32_t>()[e]; r < l.offsets.ptr<int32_t>()[e] + c.counts[e]; ++r)
          owned[static_cast<size_t>(r)] = true;
      for (int64_t r = 0; r < R; ++r)
        if (!owned[static_cast<size_t>(r)]) {
          for (int64_t j = 0; j < c.k; ++j) x.ptr<float>()[r * c.k + j] = NAN;
          for (int64_t j = 0; j < c.n; ++j) dy.ptr<float>()[r * c.n + j] = NAN;
        }
      DeviceTensor goff = to_gpu(l.offsets), gcnt = to_gpu(l.counts);
      DeviceTensor gx = to_gpu(x, DType::BF16), gdy = to_gpu(dy, DType::BF16);
      DeviceTensor gw = to_gpu(randn(wshape, DType::F32, "nan.w", 0.1), DType::BF16);
      for (ops::GroupedKernel kernel : grouped_kernels()) {
        INFO("forward / dgrad kernel " << static_cast<int>(kernel));
        DeviceTensor gy = gpu_poisoned({R, c.n}, DType::BF16), gdx = gpu_poisoned({R, c.k}, DType::BF16);
        ops::grouped_linear_forward(gx.t, gw.t, goff.t, gcnt.t, gy.t, {kernel});
        ops::grouped_linear_backward_input(gdy.t, gw.t, goff.t, gcnt.t, gdx.t, {kernel});
        Owned y = owned_rows(gy.t, l), dx = owned_rows(gdx.t, l);
        bool finite = true;
        for (int64_t i = 0; i < y->numel(); ++i) finite &= std::isfinite(y.ptr<double>()[i]);
        for (int64_t i = 0; i < dx->numel(); ++i) finite &= std::isfinite(dx.ptr<double>()[i]);
        CHECK(finite);
      }
      for (ops::GroupedKernel kernel : grouped_kernels()) {
        INFO("wgrad kernel " << static_cast<int>(kernel));
        DeviceTensor gdw = to_gpu(zeros(wshape, DType::F32, Device::CPU));
        ops::grouped_linear_backward_weight(gdy.t, gx.t, goff.t, gcnt.t, gdw.t, {kernel});
        Owned dw = to_host(gdw.t, DType::F64);
        bool finite = true;
        for (int64_t i = 0; i < dw->numel(); ++i) finite &= std::isfinite(dw.ptr<double>()[i]);
        CHECK(finite);
      }
    }
  }
}

TEST_CASE("cuda grouped linear matches a loop of cuBLASLt GEMMs per expert" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  check_against_cublas({512, 384, 0, 1000, 37}, 768, 512);  // 5 experts, 768 x 512
}

// More work units (pairs of row tiles x column tiles) than the persistent TMA kernel has
// clusters: stages and phases carried across units; odd tile counts put two experts in one pair
// of row tiles (no multicast there). The gpu-slow tier.
TEST_CASE("cuda grouped linear matches a loop of cuBLASLt GEMMs per expert: persistent, 5 experts, 2304 x 2304" * doctest::test_suite("gpu-slow")) {
  if (!gpu_available_or_skip()) return;
  check_against_cublas({2000, 0, 1300, 700, 1}, 2304, 2304);
}

#endif  // ENGINE_CUDA

TEST_CASE("cuda moe jitter matches the reference (bf16 and f32)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (DType dt : {DType::BF16, DType::F32}) {
    INFO(dtype_name(dt));
    auto [gx, x64] = device_input(randn({77, 45}, DType::F32, "jit.x"), dt);
    Owned y64 = empty({77, 45}, DType::F64, Device::CPU);
    ref::moe_jitter(x64, y64, 1234, 0.05f);
    DeviceTensor gy = gpu_poisoned({77, 45}, dt);
    ops::moe_jitter(gx.t, gy.t, 1234, 0.05f);
    CHECK_CLOSE(gy.t, y64.t, output_tol(dt, y64, kF32Tol));
  }
}
