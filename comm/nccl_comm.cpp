#include "comm/nccl_comm.h"

#ifdef ENGINE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "core/buffer.h"
#include "cuda/common/check.cuh"
#include "cuda/common/device.cuh"

#define NCCL_CHECK(expr)                                                                     \
  do {                                                                                       \
    ncclResult_t nccl_check_r_ = (expr);                                                     \
    if (nccl_check_r_ != ncclSuccess)                                                        \
      ::engine::fail_check(__FILE__, __LINE__, #expr,                                        \
                           ::engine::str_cat("NCCL error: ", ncclGetErrorString(nccl_check_r_))); \
  } while (0)

namespace engine {
namespace {

ncclDataType_t nccl_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    default: RAISE(op, ": NCCL does not carry ", dtype_name(t), " tensors");
  }
}

void check_device(const Tensor& t, const char* op) {
  ENSURE(t.device == Device::CUDA, op, ": the NCCL backend takes device tensors, got a ", device_name(t.device),
         " tensor");
}

class NcclComm final : public Comm {
 public:
  NcclComm(std::unique_ptr<Comm> host) : host_(std::move(host)) {
    ncclUniqueId id{};
    if (host_->rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    Tensor id_bytes(&id, DType::U8, Device::CPU, {static_cast<int64_t>(sizeof id)});
    host_->broadcast(id_bytes, 0);
    NCCL_CHECK(ncclCommInitRank(&comm_, host_->size(), id, host_->rank()));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming));
  }
  ~NcclComm() override {
    ncclCommDestroy(comm_);
    cudaEventDestroy(before_);
    cudaEventDestroy(after_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* backend() const override { return "nccl"; }

  void all_reduce(const Tensor& t, ReduceOp op) override { reduce_all(t, op, "all_reduce", /*wait=*/true); }
  void all_reduce_async(const Tensor& t) override { reduce_all(t, ReduceOp::Sum, "all_reduce_async", false); }
  void wait_async() override {
    CUDA_CHECK(cudaEventRecord(after_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::compute_stream()), after_, 0));
  }
  void reduce(const Tensor& t, int root) override { rooted(t, root, "reduce", true, /*wait=*/true); }
  void reduce_async(const Tensor& t, int root) override { rooted(t, root, "reduce_async", true, false); }
  void reduce_scatter(const Tensor& in, const Tensor& out) override { scatter(in, out, "reduce_scatter", true); }
  void reduce_scatter_async(const Tensor& in, const Tensor& out) override {
    scatter(in, out, "reduce_scatter_async", false);
  }
  void all_gather(const Tensor& in, const Tensor& out) override { gather(in, out, "all_gather", true); }
  void all_gather_async(const Tensor& in, const Tensor& out) override { gather(in, out, "all_gather_async", false); }
  void broadcast(const Tensor& t, int root) override { rooted(t, root, "broadcast", false, /*wait=*/true); }
  void broadcast_async(const Tensor& t, int root) override { rooted(t, root, "broadcast_async", false, false); }
  std::function<void()> fence() override {
    // An event of its own (fences are waited in any order); destroyed with the last copy of the
    // function, which CUDA allows before the event completes.
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    std::shared_ptr<CUevent_st> event(e, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
    CUDA_CHECK(cudaEventRecord(e, stream_));
    return [event] {
      CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::compute_stream()), event.get(), 0));
    };
  }
  void send(const Tensor& t, int peer, int) override {
    check_device(t, "send");
    run([&] {
      NCCL_CHECK(ncclSend(t.data, static_cast<size_t>(t.numel()), nccl_type(t.dtype, "send"), peer, comm_, stream_));
    });
  }
  void send_async(const Tensor& t, int peer, int) override {
    check_device(t, "send_async");
    run([&] {
      NCCL_CHECK(ncclSend(t.data, static_cast<size_t>(t.numel()), nccl_type(t.dtype, "send"), peer, comm_, stream_));
    }, /*wait=*/false);
  }
  void wait_sends() override { wait_async(); }
  void recv(const Tensor& t, int peer, int) override {
    check_device(t, "recv");
    run([&] {
      NCCL_CHECK(ncclRecv(t.data, static_cast<size_t>(t.numel()), nccl_type(t.dtype, "recv"), peer, comm_, stream_));
    });
  }
  void barrier() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_->barrier();
  }
  std::unique_ptr<Comm> split(int color, int key) const override {
    return std::make_unique<NcclComm>(host_->split(color, key));
  }
  double all_reduce_sum(double v) override { return host_->all_reduce_sum(v); }
  int64_t all_reduce_sum(int64_t v) override { return host_->all_reduce_sum(v); }
  double all_reduce_max(double v) override { return host_->all_reduce_max(v); }

 private:
  // The collective waits for the compute queued so far; with `wait`, later compute waits for it.
  template <typename F>
  void run(F&& f, bool wait = true) {
    cudaStream_t compute = static_cast<cudaStream_t>(cuda::compute_stream());
    CUDA_CHECK(cudaEventRecord(before_, compute));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, before_, 0));
    f();
    if (!wait) return;
    CUDA_CHECK(cudaEventRecord(after_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(compute, after_, 0));
  }

  void reduce_all(const Tensor& t, ReduceOp reduce, const char* op, bool wait) {
    check_device(t, op);
    run([&] {
      NCCL_CHECK(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()), nccl_type(t.dtype, op),
                               reduce == ReduceOp::Sum ? ncclSum : ncclMax, comm_, stream_));
    }, wait);
  }
  void scatter(const Tensor& in, const Tensor& out, const char* op, bool wait) {
    check_device(in, op);
    check_device(out, op);
    ENSURE(in.dtype == out.dtype && in.numel() == out.numel() * size(), op, ": in must hold size x out");
    run([&] {
      NCCL_CHECK(ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()), nccl_type(in.dtype, op),
                                   ncclSum, comm_, stream_));
    }, wait);
  }
  void gather(const Tensor& in, const Tensor& out, const char* op, bool wait) {
    check_device(in, op);
    check_device(out, op);
    ENSURE(in.dtype == out.dtype && out.numel() == in.numel() * size(), op, ": out must hold size x in");
    run([&] {  // in place when `in` is this rank's slice of `out` (NCCL's in-place convention)
      NCCL_CHECK(ncclAllGather(in.data, out.data, static_cast<size_t>(in.numel()), nccl_type(in.dtype, op), comm_,
                               stream_));
    }, wait);
  }

  // An in-place collective with a root (ncclBroadcast or, with `reduce`, ncclReduce sum).
  void rooted(const Tensor& t, int root, const char* op, bool reduce, bool wait) {
    check_device(t, op);
    ENSURE(root >= 0 && root < size(), op, ": root ", root, " in a group of ", size());
    const size_t n = static_cast<size_t>(t.numel());
    const ncclDataType_t type = nccl_type(t.dtype, op);
    run([&] {
      if (reduce)
        NCCL_CHECK(ncclReduce(t.data, t.data, n, type, ncclSum, root, comm_, stream_));
      else
        NCCL_CHECK(ncclBroadcast(t.data, t.data, n, type, root, comm_, stream_));
    }, wait);
  }

  std::unique_ptr<Comm> host_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(const Comm& host_group) {
  // A private copy of the host group (split with one color) that the NCCL comm owns.
  return std::make_unique<NcclComm>(host_group.split(0, host_group.rank()));
}

}  // namespace engine

#else

namespace engine {
std::unique_ptr<Comm> make_nccl_comm(const Comm&) { return nullptr; }
}  // namespace engine

#endif
