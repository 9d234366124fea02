#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "models/model.h"
#include "ops/adamw.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"

#ifdef ENGINE_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <thread>

#include "cuda/common/device.cuh"
#endif

using namespace engine;

TEST_CASE("learning-rate schedules: warmup, cosine, linear, constant, floor") {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.decay_steps = 10;
  o.decay = DecayKind::Cosine;
  CHECK(learning_rate(o, 1) == doctest::Approx(0.25));
  CHECK(learning_rate(o, 4) == doctest::Approx(1.0));
  CHECK(learning_rate(o, 9) == doctest::Approx(0.1 + 0.9 * 0.5));  // halfway through decay
  CHECK(learning_rate(o, 14) == doctest::Approx(0.1));
  CHECK(learning_rate(o, 100) == doctest::Approx(0.1));
  o.decay = DecayKind::Linear;
  CHECK(learning_rate(o, 6) == doctest::Approx(1.0 - 0.9 * 0.2));
  o.decay = DecayKind::Constant;
  CHECK(learning_rate(o, 50) == doctest::Approx(1.0));
  o.warmup_steps = 0;
  o.decay = DecayKind::Cosine;
  CHECK(learning_rate(o, 0) == doctest::Approx(1.0));
}

namespace {
// A constant learning rate without warmup or clipping.
OptimizerConfig constant_lr(double lr, double weight_decay) {
  OptimizerConfig o;
  o.lr = lr;
  o.warmup_steps = 0;
  o.decay = DecayKind::Constant;
  o.weight_decay = weight_decay;
  o.grad_clip = 0;
  return o;
}
}  // namespace

TEST_CASE("AdamW: decoupled weight decay skips norms and biases; clipping scales the update") {
  auto model = make_model(testing::tiny_model(ModelFamily::GPT2), Device::CPU, DType::F32);
  ParamStore& p = model->params();
  p.init(3);
  OptimizerConfig o = constant_lr(0.1, 0.5);
  DataParallel dp(p, world(), 0);
  AdamW opt(o, dp, 3);
  const float w_before = p.weight("layers.0.attn.wq").ptr<float>()[7];
  const float n_before = p.weight("layers.0.norm1.weight").ptr<float>()[2];
  p.zero_grads();
  StepStats st = opt.step(1);
  CHECK(st.grad_norm == 0);
  // zero gradient: Adam's term is 0, only decay acts: w <- w - lr * wd * w
  CHECK(p.weight("layers.0.attn.wq").ptr<float>()[7] == doctest::Approx(w_before * (1 - 0.1 * 0.5)));
  CHECK(p.weight("layers.0.norm1.weight").ptr<float>()[2] == n_before);

  // Clipping: a gradient of norm 10 clipped to 1 moves Adam's first step exactly as much
  // (Adam normalises), but the moments see the clipped gradient.
  o.weight_decay = 0;
  o.grad_clip = 1.0;
  DataParallel dp2(p, world(), 0);
  AdamW opt2(o, dp2, 3);
  p.zero_grads();
  Tensor g = p.grads_flat();
  const int64_t off = p.table().get("layers.1.mlp.w_out").offset;
  g.ptr<float>()[off] = 6.f;
  g.ptr<float>()[off + 1] = 8.f;
  st = opt2.step(1);
  CHECK(st.grad_norm == doctest::Approx(10.0));
  CHECK(st.clip_scale == doctest::Approx(0.1).epsilon(1e-5));
  CHECK(opt2.exp_avg().ptr<float>()[off] == doctest::Approx((1 - o.beta1) * 0.6).epsilon(1e-5));
}

TEST_CASE("AdamW: one update over the flat buffer gives every parameter its own decay; alignment gaps stay zero") {
  // The update covers the shard in one call, the decay by runs of parameters that extend back
  // over the alignment gaps before them. Against an update of each parameter alone (its slice,
  // its decay) over three steps of random gradients: the same bits; every gap element of the
  // weights, the moments and the gradients stays exactly +0.
  auto model = make_model(testing::tiny_model(ModelFamily::GPT2), Device::CPU, DType::F32);
  ParamStore& p = model->params();
  p.init(5);
  const OptimizerConfig o = constant_lr(0.05, 0.3);
  DataParallel dp(p, world(), 0);
  AdamW opt(o, dp, 3);
  const int64_t cap = p.capacity();
  Owned ref_w = empty({cap}, DType::F32, Device::CPU), ref_m = zeros({cap}, DType::F32, Device::CPU),
        ref_v = zeros({cap}, DType::F32, Device::CPU);
  copy_tensor(ref_w, p.weights_flat());
  std::vector<char> in_param(static_cast<size_t>(cap), 0);
  for (const ParamSpec& s : p.table().entries())
    std::fill_n(in_param.begin() + s.offset, s.shape.numel(), 1);
  int64_t gaps = 0;
  for (int64_t i = 0; i < p.table().total_elements(); ++i) gaps += !in_param[i];
  REQUIRE(gaps > 0);  // the tiny model has parameters of sizes off the 64-element alignment
  for (int64_t step = 1; step <= 3; ++step) {
    p.zero_grads();
    Owned g = testing::randn({cap}, DType::F32, "adamw.flat.g" + std::to_string(step));
    for (int64_t i = 0; i < cap; ++i)
      if (in_param[i]) p.grads_flat().ptr<float>()[i] = g.ptr<float>()[i];
    for (const ParamSpec& s : p.table().entries()) {
      ops::AdamWParams a;
      a.lr = static_cast<float>(o.lr);
      a.beta1 = static_cast<float>(o.beta1);
      a.beta2 = static_cast<float>(o.beta2);
      a.eps = static_cast<float>(o.eps);
      a.weight_decay = s.weight_decay ? static_cast<float>(o.weight_decay) : 0.f;
      a.step = step;
      const int64_t b = s.offset, e = s.offset + s.shape.numel();
      ops::adamw_step(ref_w->slice(b, e), p.grads_flat().slice(b, e), ref_m->slice(b, e),
                      ref_v->slice(b, e), a, Tensor{});
    }
    opt.step(step);
  }
  int64_t differ = 0, gap_nonzero = 0;
  for (int64_t i = 0; i < cap; ++i) {
    const float w = p.weights_flat().ptr<float>()[i], m = opt.exp_avg().ptr<float>()[i],
                v = opt.exp_avg_sq().ptr<float>()[i];
    if (in_param[i]) {
      differ += w != ref_w.ptr<float>()[i] || m != ref_m.ptr<float>()[i] || v != ref_v.ptr<float>()[i];
    } else {
      gap_nonzero += std::signbit(w) || w != 0.f || m != 0.f || v != 0.f ||
                     p.grads_flat().ptr<float>()[i] != 0.f;
    }
  }
  CHECK(differ == 0);
  CHECK(gap_nonzero == 0);
}

namespace {
// Rank 0 of a group of two that moves nothing and records what it is asked for: the gradient
// reductions as element ranges of `base` (the gradient buffer) in `calls`; the asynchronous
// broadcasts (as pointer, count, root) and fences in `gathers`; each fence's wait, when the
// store calls it, in `waits`.
struct RecordingComm final : Comm {
  struct Gather {
    const void* data;
    int64_t numel;
    int root;  // -1: a fence
  };
  const float* base = nullptr;
  std::vector<std::string> calls;
  std::vector<std::string>* log = &calls;  // (two groups may share one log)
  std::vector<Gather> gathers;
  std::vector<int> waits;
  int fences = 0;
  std::string range(const Tensor& t) const {
    const int64_t b = t.ptr<float>() - base;
    return "[" + std::to_string(b) + ", " + std::to_string(b + t.numel()) + ")";
  }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* backend() const override { return "recording"; }
  void all_reduce(const Tensor& t, ReduceOp) override {  // gradients only (not the scalar sums)
    if (t.dtype == DType::F32 && t.numel() > 1) log->push_back("all_reduce (sync) " + range(t));
  }
  void all_reduce_async(const Tensor& t) override { log->push_back("all_reduce " + range(t)); }
  void wait_async() override { log->push_back("wait"); }
  void reduce(const Tensor& t, int root) override { log->push_back("reduce " + range(t) + " -> " + std::to_string(root)); }
  void reduce_async(const Tensor& t, int root) override {
    log->push_back("reduce_async " + range(t) + " -> " + std::to_string(root));
  }
  void reduce_scatter(const Tensor&, const Tensor&) override { log->push_back("reduce_scatter"); }
  void all_gather(const Tensor&, const Tensor&) override {}
  void broadcast(const Tensor&, int) override {}
  void broadcast_async(const Tensor& t, int root) override { gathers.push_back({t.data, t.numel(), root}); }
  std::function<void()> fence() override {
    gathers.push_back({nullptr, 0, -1});
    return [this, k = fences++] { waits.push_back(k); };
  }
  void send(const Tensor&, int, int) override {}
  void recv(const Tensor&, int, int) override {}
  void barrier() override {}
  std::unique_ptr<Comm> split(int, int) const override { return nullptr; }
};
}  // namespace

TEST_CASE("AdamW: gradient buckets start from the backward; ZeRO 2/3 reduce each piece onto its shard's owner") {
  // Buckets of a third of the buffer: the backward completes the last third, then the middle one
  // (which straddles the two shards), and step() reduces the first. Stage 0/1 all-reduce each
  // bucket; stage 2/3 cut it at the shard boundary and reduce each piece onto the rank owning it.
  auto model = make_model(testing::tiny_model(ModelFamily::Llama), Device::CPU, DType::F32);
  ParamStore& p = model->params();
  p.init(3);
  const int64_t n = p.capacity(), half = n / 2, third = n / 3;
  REQUIRE(n % 2 == 0);
  auto r = [](int64_t b, int64_t e) { return "[" + std::to_string(b) + ", " + std::to_string(e) + ")"; };
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    RecordingComm comm;
    DataParallel dp(p, comm, stage, third);
    AdamW opt(constant_lr(0.1, 0), dp, 3);
    CHECK(opt.shard_end() - opt.shard_begin() == half);
    opt.begin_step();
    p.zero_grads();
    comm.base = p.grads_flat().ptr<float>();
    dp.grads_ready(n - third / 2);  // not a whole bucket yet: nothing starts
    CHECK(comm.calls.empty());
    dp.grads_ready(n - third);
    dp.grads_ready(n - 2 * third);
    dp.grads_ready(0);  // the whole buffer complete: the rest starts now, step() only waits
    CHECK(comm.calls.size() == (stage == 1 ? 3u : 4u));
    opt.step(1);
    std::vector<std::string> expect;
    if (stage == 1) {
      expect = {"all_reduce " + r(n - third, n), "all_reduce " + r(n - 2 * third, n - third),
                "all_reduce " + r(0, n - 2 * third), "wait"};
    } else {
      expect = {"reduce_async " + r(n - third, n) + " -> 1", "reduce_async " + r(n - 2 * third, half) + " -> 0",
                "reduce_async " + r(half, n - third) + " -> 1", "reduce_async " + r(0, n - 2 * third) + " -> 0",
                "wait"};
    }
    CHECK(comm.calls == expect);
    p.wait_weights(n);  // (stage 1/2: the update's gather; the store must not outlive its fences)
  }

  // Stage 2/3 with a tied copy (as the first and last pipeline ranks' embeddings): no bucket
  // starts from the backward; step() sums the tied rows over their group first, then reduces.
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    RecordingComm comm, tied;
    tied.log = &comm.calls;
    ModelParallelGroups g;
    g.tied = &tied;
    g.tied_params = {"layers.0.norm1.weight"};
    DataParallel dp(p, comm, stage, third, g);
    AdamW opt(constant_lr(0.1, 0), dp, 3);
    opt.begin_step();
    p.zero_grads();
    comm.base = tied.base = p.grads_flat().ptr<float>();
    dp.grads_ready(n - third);
    dp.grads_ready(0);
    CHECK(comm.calls.empty());
    opt.step(1);
    const ParamSpec& t = p.table().get("layers.0.norm1.weight");
    REQUIRE(comm.calls.size() >= 3);
    CHECK(comm.calls[0] == "all_reduce (sync) " + r(t.offset, t.offset + t.shape.numel()));
    CHECK(comm.calls[1] == "reduce_async " + r(0, half) + " -> 0");
    CHECK(comm.calls[2] == "reduce_async " + r(half, n) + " -> 1");
    p.wait_weights(n);
  }
  p.allocate_weights();  // (stage 3 left them released)
}

TEST_CASE("AdamW: ZeRO gathers the weights bucket by bucket from their owners; a view waits only for the buckets it reaches") {
  // Buckets of 3/8 of the buffer: [0, 3n/8) from rank 0, [3n/8, 6n/8) straddling the shards
  // (rank 0's piece, then rank 1's), [6n/8, n) from rank 1; a fence after each. Stage 1/2 gather
  // after the update, stage 3 in begin_step(); the views then wait for the buckets in order.
  const ModelConfig config = testing::tiny_model(ModelFamily::Llama);
  const int64_t table = make_model(config, Device::CPU, DType::F32)->params().capacity();
  auto model = make_model(config, Device::CPU, DType::F32, (table + 127) / 128 * 128);
  ParamStore& p = model->params();
  p.init(3);
  const int64_t n = p.capacity(), e = n / 8;
  REQUIRE(n % 16 == 0);
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    RecordingComm comm;
    DataParallel dp(p, comm, stage, 3 * e);
    AdamW opt(constant_lr(0.1, 0), dp, 3);
    opt.begin_step();
    p.zero_grads();
    if (stage < 3) {
      CHECK(comm.gathers.empty());
      opt.step(1);
    }
    REQUIRE(p.has_weights());
    REQUIRE(p.pending_weight_ranges() == 3);
    const char* w0 = static_cast<const char*>(p.weight_at(0, {1}).data);  // waits for bucket 0 only
    std::vector<std::string> got;
    for (const auto& g : comm.gathers)
      got.push_back(g.root < 0 ? "fence"
                               : "[" + std::to_string((static_cast<const char*>(g.data) - w0) / 4) + ", " +
                                     std::to_string((static_cast<const char*>(g.data) - w0) / 4 + g.numel) + ") <- " +
                                     std::to_string(g.root));
    auto r = [](int64_t b, int64_t en, int root) {
      return "[" + std::to_string(b) + ", " + std::to_string(en) + ") <- " + std::to_string(root);
    };
    CHECK(got == std::vector<std::string>{r(0, 3 * e, 0), "fence", r(3 * e, 4 * e, 0), r(4 * e, 6 * e, 1), "fence",
                                          r(6 * e, n, 1), "fence"});
    CHECK(comm.waits == std::vector<int>{0});
    p.weight_at(3 * e - 5, {5});  // still inside bucket 0
    CHECK(comm.waits == std::vector<int>{0});
    p.weight_at(5 * e, {e});  // bucket 1
    CHECK(comm.waits == std::vector<int>{0, 1});
    CHECK(p.pending_weight_ranges() == 1);
    if (stage == 3) {
      opt.step(1);  // releases the weights: after the last bucket
    } else {
      p.weights_flat();
    }
    CHECK(comm.waits == std::vector<int>{0, 1, 2});
    CHECK(p.pending_weight_ranges() == 0);
  }
  p.allocate_weights();  // (stage 3 left them released)
}

TEST_CASE("ParamStore on the GPU: a view waits for its pending range (a late writer on another stream)" *
          doctest::test_suite("gpu")) {
  if (!testing::gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  // The second range's bytes arrive on a side stream held back 300 ms by a host function, as a
  // gather's broadcast would; the view of that range must see them (its copy to the host runs on
  // the compute stream, after the wait the store made it issue). Reading the first range, already
  // there, runs only that range's wait.
  auto model = make_model(testing::tiny_model(ModelFamily::Llama), Device::CUDA, DType::BF16);
  ParamStore& p = model->params();
  p.init(3);
  const int64_t n = p.capacity(), half = n / 2;
  const Tensor w = p.weights_flat();
  Owned before = testing::to_host(w, DType::F64);
  Owned ones_host = empty({n - half}, DType::F32, Device::CPU);
  for (int64_t i = 0; i < n - half; ++i) testing::set(ones_host, i, 1.0);
  Owned ones = testing::to_device(ones_host, Device::CUDA, DType::BF16);
  (void)testing::to_host(ones, DType::F64);  // (the upload, on the compute stream, has completed)
  cudaStream_t side = nullptr;
  cudaEvent_t arrived = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaLaunchHostFunc(side, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
                             nullptr) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(w.slice(half, n).data, ones->data, static_cast<size_t>(n - half) * 2,
                          cudaMemcpyDeviceToDevice, side) == cudaSuccess);
  REQUIRE(cudaEventRecord(arrived, side) == cudaSuccess);
  int waited = 0;
  std::vector<ParamStore::PendingWeights> ranges;
  ranges.push_back({0, [&] { ++waited; }});
  ranges.push_back({half, [&] {
                      ++waited;
                      cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::compute_stream()), arrived, 0);
                    }});
  p.set_pending_weights(std::move(ranges));
  Owned first = testing::to_host(p.weight_at(0, {half}), DType::F64);
  CHECK(waited == 1);
  Owned second = testing::to_host(p.weight_at(half, {n - half}), DType::F64);
  CHECK(waited == 2);
  int64_t stale = 0;
  for (int64_t i = 0; i < n - half; ++i) stale += testing::get(second, i) != 1.0;
  CHECK(stale == 0);
  CHECK(testing::get(first, 0) == testing::get(before, 0));
  p.wait_weights(n);  // (whatever failed: the waits must not outlive `waited` and `arrived`)
  cudaStreamSynchronize(side);
  cudaEventDestroy(arrived);
  cudaStreamDestroy(side);
#endif
}
