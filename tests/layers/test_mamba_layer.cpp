// The Mamba mixer layer (csrc/layers/mamba.cpp): fp64 finite differences of the input and every
// parameter gradient on CPU over packed documents (lengths 1, 5, 7; scan chunks straddling them);
// packed documents giving the outputs and gradients of each document alone; the init rules
// (A_log = log(n + 1), D = 1, softplus(dt_bias) in [dt_min, dt_max], layout independent under
// tensor parallelism); the GPU layer (bf16) against the CPU layer (f64 on the same bf16 weights
// and inputs) within bf16 tolerance.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "layers/mamba.h"
#include "tests/common/gpu_testing.h"
#include "tests/common/gradcheck.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

const layers::Env kEnv{Device::CPU, DType::F64};
constexpr double kTol = 1e-6;

struct Segments {
  Owned cu, positions;
  layers::SegmentInfo info() const {
    int max_len = 0;
    for (int64_t s = 0; s + 1 < cu->numel(); ++s)
      max_len = std::max(max_len, cu.ptr<int32_t>()[s + 1] - cu.ptr<int32_t>()[s]);
    return {.cu_seqlens = cu, .positions = positions, .max_seqlen = max_len};
  }
};

Segments segments(const std::vector<int32_t>& docs) {
  int32_t total = 0;
  for (int32_t l : docs) total += l;
  Segments s{empty({static_cast<int64_t>(docs.size()) + 1}, DType::I32, Device::CPU),
             empty({total}, DType::I32, Device::CPU)};
  int32_t at = 0;
  s.cu.ptr<int32_t>()[0] = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    for (int32_t j = 0; j < docs[i]; ++j) s.positions.ptr<int32_t>()[at + j] = j;
    s.cu.ptr<int32_t>()[i + 1] = at += docs[i];
  }
  return s;
}

ParamStore make_store(const layers::MambaConfig& c, const std::string& name) {
  ParamTable t;
  layers::Mamba::declare(t, "m", c);
  ParamStore store(t, Device::CPU, DType::F64);
  randomize_weights(store, name);
  return store;
}

struct LayerCase {
  const char* name;
  layers::MambaConfig c;
};

std::vector<LayerCase> layer_cases() {
  layers::MambaConfig a;
  a.hidden = 6, a.d_inner = 10, a.d_state = 3, a.d_conv = 4, a.dt_rank = 2, a.conv_bias = true,
  a.proj_bias = true, a.chunk_len = 4;
  layers::MambaConfig b;
  b.hidden = 8, b.d_state = 4, b.d_conv = 3, b.conv_bias = false, b.proj_bias = false, b.chunk_len = 5;
  return {{"Di10 N3 K4 R2 biases chunk4", a}, {"Di 2C N4 K3 R ceil(C/16) no biases chunk5", b}};
}

}  // namespace

TEST_CASE("mamba layer gradients match fp64 finite differences (input and every parameter)") {
  const Segments seg = segments({1, 5, 7});
  const int64_t T = 13;
  for (const LayerCase& k : layer_cases()) {
    SUBCASE(k.name) {
      ParamStore store = make_store(k.c, k.name);
      layers::Mamba mamba(store, "m", k.c);
      layers::MambaSaved saved;
      Owned x = randn({T, k.c.hidden}, DType::F64, "mamba.x"), r = randn({T, k.c.hidden}, DType::F64, "mamba.r");
      Owned y = empty({T, k.c.hidden}, DType::F64, Device::CPU);
      auto loss = [&] {
        mamba.forward(kEnv, x, y, seg.info(), saved);
        return dot(y, r);
      };
      store.zero_grads();
      Owned dx = empty({T, k.c.hidden}, DType::F64, Device::CPU);
      poison(dx);
      loss();
      mamba.backward(kEnv, r, x, seg.info(), saved, dx);
      auto cx = finite_difference_check(loss, x, dx, std::string(k.name) + " dx");
      INFO(cx.report);
      CHECK(cx.rel_rms < kTol);
      for (const ParamSpec& p : store.table().entries()) {
        auto cp = finite_difference_check(loss, store.weight(p.name), store.grad(p.name), p.name, 200);
        INFO(p.name, ": ", cp.report);
        CHECK(cp.rel_rms < kTol);
      }
    }
  }
}

TEST_CASE("mamba layer: packed documents give each document's outputs and gradients") {
  const layers::MambaConfig c = layer_cases()[0].c;
  ParamStore store = make_store(c, "pack");
  layers::Mamba mamba(store, "m", c);
  const std::vector<int32_t> docs = {5, 8};
  const int64_t T = 13, C = c.hidden;
  const Segments packed_seg = segments(docs);
  Owned x = randn({T, C}, DType::F64, "pack.x"), r = randn({T, C}, DType::F64, "pack.r");
  Owned y = empty({T, C}, DType::F64, Device::CPU), dx = empty({T, C}, DType::F64, Device::CPU);
  layers::MambaSaved saved;
  store.zero_grads();
  mamba.forward(kEnv, x, y, packed_seg.info(), saved);
  mamba.backward(kEnv, r, x, packed_seg.info(), saved, dx);
  Owned packed_grads = to_host(store.grads_flat(), DType::F64);
  Owned grad_sum = zeros(packed_grads->shape, DType::F64, Device::CPU);
  int64_t begin = 0;
  for (int32_t len : docs) {
    CAPTURE(len);
    const Segments one = segments({len});
    Owned x1 = to_host(x.t.slice(begin, begin + len), DType::F64), r1 = to_host(r.t.slice(begin, begin + len), DType::F64);
    Owned y1 = empty({len, C}, DType::F64, Device::CPU), dx1 = empty({len, C}, DType::F64, Device::CPU);
    layers::MambaSaved s1;
    store.zero_grads();
    mamba.forward(kEnv, x1, y1, one.info(), s1);
    mamba.backward(kEnv, r1, x1, one.info(), s1, dx1);
    CHECK_CLOSE(y1.t, y.t.slice(begin, begin + len), 1e-13);
    CHECK_CLOSE(dx1.t, dx.t.slice(begin, begin + len), 1e-13);
    Owned g = to_host(store.grads_flat(), DType::F64);
    for (int64_t i = 0; i < g->numel(); ++i) set(grad_sum, i, get(grad_sum, i) + get(g, i));
    begin += len;
  }
  CHECK_CLOSE(grad_sum.t, packed_grads.t, 1e-13);
}

TEST_CASE("mamba layer init: A_log, D, dt_bias, dt_proj as Hugging Face, layout independent") {
  layers::MambaConfig c;
  c.hidden = 24, c.d_state = 5, c.d_conv = 4, c.conv_bias = true;  // Di 48, R 2
  const int64_t Di = c.inner(), N = c.d_state, R = c.rank();
  ParamTable t1;
  layers::Mamba::declare(t1, "m", c);
  ParamStore s1(t1, Device::CPU, DType::F64);
  s1.init(5);
  const Tensor alog = s1.weight("m.A_log"), D = s1.weight("m.D"), bias = s1.weight("m.dt_bias"),
               dtw = s1.weight("m.dt_proj"), conv = s1.weight("m.conv_weight");
  for (int64_t d = 0; d < Di; ++d) {
    for (int64_t n = 0; n < N; ++n) CHECK(get(alog, d * N + n) == doctest::Approx(std::log(n + 1.0)));
    CHECK(get(D, d) == 1.0);
    const double dt = std::log1p(std::exp(get(bias, d)));  // softplus
    CHECK(dt >= c.dt_min * (1 - 1e-9));
    CHECK(dt <= c.dt_max * (1 + 1e-9));
    for (int64_t k = 0; k < c.d_conv; ++k) CHECK(std::fabs(get(conv, d * c.d_conv + k)) <= 0.5);
    for (int64_t j = 0; j < R; ++j) CHECK(std::fabs(get(dtw, d * R + j)) <= 1 / std::sqrt(double(R)));
  }
  // Not all equal: drawn, not constant.
  CHECK(get(bias, 0) != get(bias, 1));
  // A floor above dt_max lifts every dt to it.
  layers::MambaConfig f = c;
  f.dt_init_floor = 0.5;
  ParamTable tf;
  layers::Mamba::declare(tf, "m", f);
  ParamStore sf(tf, Device::CPU, DType::F64);
  sf.init(5);
  CHECK(std::log1p(std::exp(get(sf.weight("m.dt_bias"), 3))) == doctest::Approx(0.5));

  // Tensor-parallel rank r holds exactly its block of every tensor (in_proj: its rows of x and
  // of z, adjacent), whatever the layout.
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    ParamTable t2(rank, 2);
    layers::Mamba::declare(t2, "m", c);
    ParamStore s2(t2, Device::CPU, DType::F64);
    s2.init(5);
    for (const ParamSpec& p : t2.entries()) {
      CAPTURE(p.name);
      const Tensor full = s1.weight(p.name), local = s2.weight(p.name);
      bool same = true;
      for (int64_t i = 0; i < local.numel(); ++i) same = same && get(local, i) == get(full, full_index(p, i));
      CHECK(same);
    }
    layers::Mamba m2(s2, "m", c);  // adjacency of in_proj_x and in_proj_z checked by the constructor
  }
}

TEST_CASE("mamba layer on the GPU (bf16) matches the CPU layer within bf16 tolerance" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  layers::MambaConfig c;
  c.hidden = 64, c.d_inner = 96, c.d_state = 16, c.d_conv = 4, c.dt_rank = 4, c.conv_bias = true,
  c.proj_bias = true, c.init_std = 0.1, c.chunk_len = 64;
  const std::vector<int32_t> docs = {1, 37, 200, 5};
  const int64_t T = 243, C = c.hidden;
  ParamTable table;
  layers::Mamba::declare(table, "m", c);
  ParamStore gpu(table, Device::CUDA, DType::BF16), cpu(table, Device::CPU, DType::F64);
  gpu.init(17);
  copy_tensor(cpu.weights_flat(), to_host(gpu.weights_flat(), DType::F64));  // the same bf16 values
  layers::Mamba gm(gpu, "m", c), cm(cpu, "m", c);
  const Segments seg = segments(docs);
  DeviceTensor gcu = to_gpu(seg.cu), gpos = to_gpu(seg.positions);
  const layers::SegmentInfo gseg{.cu_seqlens = gcu.t, .positions = gpos.t, .max_seqlen = seg.info().max_seqlen};
  auto [gx, x64] = device_input(randn({T, C}, DType::F32, "gpu.x"), DType::BF16);
  auto [gdy, dy64] = device_input(randn({T, C}, DType::F32, "gpu.dy"), DType::BF16);

  const layers::Env genv{Device::CUDA, DType::BF16};
  layers::MambaSaved gs, cs;
  DeviceTensor gy = gpu_poisoned({T, C}, DType::BF16), gdx = gpu_poisoned({T, C}, DType::BF16);
  gm.forward(genv, gx.t, gy.t, gseg, gs);
  gm.backward(genv, gdy.t, gx.t, gseg, gs, gdx.t);
  Owned y64 = empty({T, C}, DType::F64, Device::CPU), dx64 = empty({T, C}, DType::F64, Device::CPU);
  cm.forward(kEnv, x64, y64, seg.info(), cs);
  cm.backward(kEnv, dy64, x64, seg.info(), cs, dx64);
  // bf16 activations between every step (xz, xc, the x_proj and dt outputs, y): a few roundings
  // in a chain, not one.
  CHECK_CLOSE(gy.t, y64.t, 2e-2);
  CHECK_CLOSE(gdx.t, dx64.t, 3e-2);
  CHECK_CLOSE(gpu.grads_flat(), cpu.grads_flat(), 3e-2);
  for (const ParamSpec& p : table.entries()) {
    CAPTURE(p.name);
    CHECK_CLOSE(gpu.grad(p.name), cpu.grad(p.name), 1e-1);
  }
}
