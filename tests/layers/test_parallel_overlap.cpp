// Tensor-parallel overlap (parallel/tensor_parallel.h) on one GPU: a column-parallel linear's forward and
// backward, with collectives that land late, give the bits they give with collectives that land
// at once. The group is a stand-in for two ranks (below), so the test needs one GPU; the
// multi-GPU runs against one GPU are tests/dist/test_model_parallel.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "layers/linear.h"
#include "parallel/tensor_parallel.h"
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

// A group of two on one GPU, this process being rank `rank`, whose other rank holds zeros: an
// all-gather puts zeros in the other rank's rows, a reduce-scatter returns this rank's rows of its
// input, an all-reduce leaves its tensor as it is. With `late`, an *_async collective first fills
// its output with NaN (on the compute stream, at once) and writes the result on a side stream
// held back 100 ms: compute that reads the output without its fence's wait reads NaN.
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

  void all_reduce(const Tensor&, ReduceOp) override {}
  void all_reduce_async(const Tensor& t) override {
    if (!late_) return;
    scratch_.push_back(empty(t.shape, t.dtype, Device::CUDA));  // the values, kept past the poison
    const Tensor kept = scratch_.back();
    copy(kept, t, compute());
    later(t, [this, t, kept](cudaStream_t s) { copy(t, kept, s); });
  }
  void reduce_scatter(const Tensor& in, const Tensor& out) override { own_rows(in, out, compute()); }
  void reduce_scatter_async(const Tensor& in, const Tensor& out) override {
    later(out, [this, in, out](cudaStream_t s) { own_rows(in, out, s); });
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
  static void copy(const Tensor& to, const Tensor& from, cudaStream_t s) {
    REQUIRE(cudaMemcpyAsync(to.data, from.data, bytes(from), cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  }
  void own_rows(const Tensor& in, const Tensor& out, cudaStream_t s) {
    REQUIRE(in.numel() == 2 * out.numel());
    REQUIRE(cudaMemcpyAsync(out.data, static_cast<const char*>(in.data) + rank_ * bytes(out), bytes(out),
                            cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  }
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
  std::vector<Owned> scratch_;
  int fences_ = 0, waits_ = 0;
};

struct Outputs {
  Owned y, dw, db, dxn;  // on the host
  int fences = 0, waits = 0;
};

// y = x W^T + b through column_gemm_forward, then column_linear_backward from dy.
Outputs run_linear(const Tensor& xn, const Tensor& w, const Tensor& b, const Tensor& dy, int rank, bool sp,
                   bool overlap, bool late) {
  StandInPair pair(rank, late);
  const layers::Env env{Device::CUDA, DType::BF16, &pair, sp, overlap};
  const int64_t T = dy.size(0), F = w.size(0), C = w.size(1);
  Owned y = empty({T, F}, DType::BF16, Device::CUDA);
  layers::column_gemm_forward(env, xn, [&](const Tensor& x, int64_t r0, int64_t r1) {
    layers::linear_forward(layers::LinearPrecision{}, x, w, b, y->slice(r0, r1));
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
      const int64_t n = k.sp ? T / 2 : T, r0 = k.sp ? k.rank * n : 0;
      const DeviceInput xn = device_input(randn({n, C}, DType::F32, "xn"), DType::BF16);
      const DeviceInput w = device_input(randn({F, C}, DType::F32, "w", 0.1), DType::BF16);
      const DeviceInput b = device_input(randn({F}, DType::F32, "b"), DType::BF16);
      const DeviceInput dy = device_input(randn({T, F}, DType::F32, "dy"), DType::BF16);
      const Outputs now = run_linear(xn.dev.t, w.dev.t, b.dev.t, dy.dev.t, k.rank, k.sp, true, false);
      const Outputs late = run_linear(xn.dev.t, w.dev.t, b.dev.t, dy.dev.t, k.rank, k.sp, true, true);
      const Outputs inline_ = run_linear(xn.dev.t, w.dev.t, b.dev.t, dy.dev.t, k.rank, k.sp, false, false);
      // with sequence parallelism: two gathers (forward, backward) and the reduce-scatter;
      // without: the all-reduce
      CHECK(late.fences == (k.sp ? 3 : 1));
      CHECK(late.waits == late.fences);
      CHECK(inline_.fences == 0);
      CHECK(bitwise_equal(late.y, now.y));
      CHECK(bitwise_equal(late.dw, now.dw));
      CHECK(bitwise_equal(late.db, now.db));
      CHECK(bitwise_equal(late.dxn, now.dxn));

      // f64 on the host: the full input is xn in this rank's rows and the other rank's zeros.
      Owned x = zeros({T, C}, DType::F64, Device::CPU);
      for (int64_t i = 0; i < n * C; ++i) set(x, r0 * C + i, get(xn.f64, i));
      Owned y = empty({T, F}, DType::F64, Device::CPU), dw = zeros({F, C}, DType::F64, Device::CPU),
            db = zeros({F}, DType::F64, Device::CPU), dxn = zeros({n, C}, DType::F64, Device::CPU);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t f = 0; f < F; ++f) {
          double acc = get(b.f64, f);
          for (int64_t c = 0; c < C; ++c) acc += get(x, t * C + c) * get(w.f64, f * C + c);
          set(y, t * F + f, acc);
          const double g = get(dy.f64, t * F + f);
          set(db, f, get(db, f) + g);
          for (int64_t c = 0; c < C; ++c) {
            set(dw, f * C + c, get(dw, f * C + c) + g * get(x, t * C + c));
            if (t >= r0 && t < r0 + n) set(dxn, (t - r0) * C + c, get(dxn, (t - r0) * C + c) + g * get(w.f64, f * C + c));
          }
        }
      for (const Outputs* o : {&now, &inline_}) {
        CHECK_CLOSE(o->y, y, bf16_tol(y));
        CHECK_CLOSE(o->dw, dw, 1e-5);
        CHECK_CLOSE(o->db, db, 1e-5);
        CHECK_CLOSE(o->dxn, dxn, bf16_tol(dxn));
      }
    }
  }
#endif
}
