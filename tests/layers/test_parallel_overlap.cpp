// Tensor-parallel overlap (layers/parallel.h) on one GPU: a column-parallel linear's forward and
// backward, with collectives that land late, give the bits they give with collectives that land
// at once. The group is a stand-in for two ranks (below), so the test needs one GPU; the
// multi-GPU runs against one GPU are tests/dist/test_model_parallel.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "layers/linear.h"
#include "layers/parallel.h"
#include "tests/common/gpu_testing.h"

#ifdef ENGINE_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <thread>

#include "cuda/common/device.cuh"
#endif

using namespace engine;
using namespace engine::testing;

#ifdef ENGINE_CUDA
namespace {

cudaStream_t compute() { return static_cast<cudaStream_t>(cuda::compute_stream()); }
size_t bytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype); }

// A group of two on one GPU, this process being rank `rank`. Its other rank holds zeros where a
// gather takes its rows and minus this rank's values where a reduction sums, so every result is a
// copy of this rank's bytes or zeros. With `late`, an *_async collective first fills its output
// with NaN (on the compute stream, at once) and writes the result on a side stream held back
// 100 ms: compute that reads the output without its fence's wait reads NaN.
class StandInPair final : public Comm {
 public:
  StandInPair(int rank, bool late) : rank_(rank), late_(late) {
    REQUIRE(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~StandInPair() override {
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
  }
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  const char* backend() const override { return "stand-in pair"; }

  void all_reduce(const Tensor& t, ReduceOp) override { zero(t, compute()); }
  void all_reduce_async(const Tensor& t) override {
    later(t, [this, t](cudaStream_t s) { zero(t, s); });
  }
  void reduce_scatter(const Tensor&, const Tensor& out) override { zero(out, compute()); }
  void reduce_scatter_async(const Tensor&, const Tensor& out) override {
    later(out, [this, out](cudaStream_t s) { zero(out, s); });
  }
  void all_gather(const Tensor& in, const Tensor& out) override { gather(in, out, compute()); }
  void all_gather_async(const Tensor& in, const Tensor& out) override {
    REQUIRE((static_cast<const char*>(in.data) >= static_cast<const char*>(out.data) + bytes(out) ||
             static_cast<const char*>(in.data) + bytes(in) <= static_cast<const char*>(out.data)));
    later(out, [this, in, out](cudaStream_t s) { gather(in, out, s); });
  }
  std::function<void()> fence() override {
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, side_) == cudaSuccess);
    ++fences_;
    return [this, e] {
      ++waits_;
      REQUIRE(cudaStreamWaitEvent(compute(), e, 0) == cudaSuccess);
      cudaEventDestroy(e);  // (CUDA keeps it until the wait has passed)
    };
  }
  void wait_async() override { fence()(); }

  void reduce(const Tensor&, int) override { unused("reduce"); }
  void broadcast(const Tensor&, int) override { unused("broadcast"); }
  void send(const Tensor&, int, int) override { unused("send"); }
  void recv(const Tensor&, int, int) override { unused("recv"); }
  void barrier() override {}
  std::unique_ptr<Comm> split(int, int) const override {
    unused("split");
    return nullptr;
  }
  int fences() const { return fences_; }
  int waits() const { return waits_; }

 private:
  static void unused(const char* op) { FAIL("the stand-in pair does not do ", op); }
  void zero(const Tensor& t, cudaStream_t s) { REQUIRE(cudaMemsetAsync(t.data, 0, bytes(t), s) == cudaSuccess); }
  void gather(const Tensor& in, const Tensor& out, cudaStream_t s) {
    REQUIRE(out.numel() == 2 * in.numel());
    char* o = static_cast<char*>(out.data);
    REQUIRE(cudaMemcpyAsync(o + rank_ * bytes(in), in.data, bytes(in), cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(o + (1 - rank_) * bytes(in), 0, bytes(in), s) == cudaSuccess);
  }
  template <typename F>
  void later(const Tensor& out, F&& write) {
    if (!late_) return write(compute());
    REQUIRE(cudaMemsetAsync(out.data, 0xff, bytes(out), compute()) == cudaSuccess);  // NaN in bf16 and f32
    cudaEvent_t issued = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventRecord(issued, compute()) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side_, issued, 0) == cudaSuccess);
    cudaEventDestroy(issued);
    REQUIRE(cudaLaunchHostFunc(side_, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); },
                               nullptr) == cudaSuccess);
    write(side_);
  }

  int rank_;
  bool late_;
  cudaStream_t side_ = nullptr;
  int fences_ = 0, waits_ = 0;
};

struct Outputs {
  Owned y, dw, db, dxn;  // on the host
  int fences = 0, waits = 0;
};

// y = x W^T + b through column_gemm_forward, then column_linear_backward from dy.
Outputs run_linear(const Tensor& xn, const Tensor& w, const Tensor& b, const Tensor& dy, int rank, bool sp,
                   bool late) {
  StandInPair pair(rank, late);
  const layers::Env env{Device::CUDA, DType::BF16, &pair, sp, /*tp_overlap=*/true};
  const int64_t T = dy.size(0), F = w.size(0), C = w.size(1);
  Owned y = empty({T, F}, DType::BF16, Device::CUDA);
  layers::column_gemm_forward(env, xn, [&](const Tensor& x, int64_t r0, int64_t r1) {
    layers::linear_forward(x, w, b, y->slice(r0, r1));
  });
  Owned dw = zeros({F, C}, DType::F32, Device::CUDA), db = zeros({F}, DType::F32, Device::CUDA);
  Owned dxn = empty(xn.shape, DType::BF16, Device::CUDA);
  {
    layers::ColumnInput in(env, xn);
    layers::column_linear_backward(env, dy, in, w, dxn, dw, db);
  }
  Outputs o{to_host(y, DType::BF16), to_host(dw, DType::F32), to_host(db, DType::F32), to_host(dxn, DType::BF16)};
  o.fences = pair.fences();
  o.waits = pair.waits();
  return o;
}

}  // namespace
#endif

TEST_CASE("tensor-parallel overlap on the GPU: late collectives give the bits of prompt ones" *
          doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  const int64_t T = 96, C = 64, F = 80;
  struct Case {
    bool sp;
    int rank;
  };
  for (const Case& k : {Case{false, 0}, Case{true, 0}, Case{true, 1}}) {
    SUBCASE((std::string(k.sp ? "sequence parallel, rank " : "tensor parallel, rank ") + std::to_string(k.rank))
                .c_str()) {
      Owned xn = to_device(randn({k.sp ? T / 2 : T, C}, DType::F32, "xn"), Device::CUDA, DType::BF16);
      Owned w = to_device(randn({F, C}, DType::F32, "w", 0.1), Device::CUDA, DType::BF16);
      Owned b = to_device(randn({F}, DType::F32, "b"), Device::CUDA, DType::BF16);
      Owned dy = to_device(randn({T, F}, DType::F32, "dy"), Device::CUDA, DType::BF16);
      const Outputs now = run_linear(xn, w, b, dy, k.rank, k.sp, false);
      const Outputs late = run_linear(xn, w, b, dy, k.rank, k.sp, true);
      // with sequence parallelism: two gathers (forward, backward) and the reduce-scatter;
      // without: the all-reduce
      CHECK(late.fences == (k.sp ? 3 : 1));
      CHECK(late.waits == late.fences);
      CHECK(bitwise_equal(late.y, now.y));
      CHECK(bitwise_equal(late.dw, now.dw));
      CHECK(bitwise_equal(late.db, now.db));
      CHECK(bitwise_equal(late.dxn, now.dxn));
      // and the prompt run computed something: no NaN, the gathered rows reached the products
      int64_t nan = 0;
      for (const Owned* t : {&now.y, &now.dw, &now.db, &now.dxn})
        for (int64_t i = 0; i < (*t)->numel(); ++i) nan += std::isnan(get(*t, i));
      CHECK(nan == 0);
      double dw_sum = 0;
      for (int64_t i = 0; i < now.dw->numel(); ++i) dw_sum += std::abs(get(now.dw, i));
      CHECK(dw_sum > 0);
    }
  }
#endif
}
