// The shared expert's sigmoid gate (contract: csrc/ops/moe.h, Qwen2-MoE):
//   forward   y_t += sigmoid(l_t) shared_t
//   backward  dshared_t = sigmoid(l_t) dy_t,  dl_t = sigmoid(l_t) (1 - sigmoid(l_t)) dot(dy_t, shared_t)
//   shared_gate_forward_kernel   elementwise over (T, C), the token's gate read per element
//   shared_gate_backward_kernel  one warp per token (grid-stride): dshared written as the dot
//     product is summed in f32 by the lanes, then a warp sum (a fixed order: the same bits every
//     run)
// The shared preconditions ran before (ops/moe.cpp); the launchers check what is theirs: logits
// f32, the (T, C) tensors bf16 or f32, dlogits bf16 or f32.
#include "cuda/common/launch.cuh"
#include "cuda/common/warp.cuh"
#include "ops/moe.h"

namespace engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

template <typename T>
static __global__ void shared_gate_forward_kernel(const float* logits, const T* shared, T* y,
                                                  int64_t tokens, int64_t cols) {
  const int64_t n = tokens * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = sigmoidf(logits[i / cols]);
    y[i] = from_float<T>(to_float(y[i]) + g * to_float(shared[i]));
  }
}

template <typename T, typename TOut>
static __global__ void shared_gate_backward_kernel(const T* dy, const float* logits,
                                                   const T* shared, T* dshared, TOut* dlogits,
                                                   int64_t tokens, int64_t cols) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t t = blockIdx.x * int64_t{kWarps} + warp; t < tokens;
       t += int64_t{gridDim.x} * kWarps) {
    const float g = sigmoidf(logits[t]);
    const T *d = dy + t * cols, *s = shared + t * cols;
    T* ds = dshared + t * cols;
    float dot = 0.f;
    for (int64_t c = lane; c < cols; c += 32) {
      const float dv = to_float(d[c]);
      dot += dv * to_float(s[c]);
      ds[c] = from_float<T>(g * dv);
    }
    dot = warp_sum(dot);
    if (lane == 0) dlogits[t] = from_float<TOut>(g * (1.f - g) * dot);
  }
}

// t in bf16 or f32.
void expect_float(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}

}  // namespace

void moe_shared_gate_forward(const Tensor& logits, const Tensor& shared, const Tensor& y) {
  const char* op = "moe_shared_gate_forward";
  ops::expect_dtype(logits, DType::F32, op, "logits");
  expect_float(shared, op, "shared");  // y: shared's dtype
  const int64_t T = shared.size(0), C = shared.size(1);
  if (T * C == 0) return;
  float_switch(shared.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    shared_gate_forward_kernel<T_><<<stream_blocks(T * C, 256), 256, 0, stream()>>>(
        logits.ptr<float>(), static_cast<const T_*>(shared.data), static_cast<T_*>(y.data), T, C);
  });
  check_launch("shared_gate_forward_kernel");
}

void moe_shared_gate_backward(const Tensor& dy, const Tensor& logits, const Tensor& shared,
                              const Tensor& dshared, const Tensor& dlogits) {
  const char* op = "moe_shared_gate_backward";
  ops::expect_dtype(logits, DType::F32, op, "logits");
  expect_float(shared, op, "shared");  // dy, dshared: shared's dtype
  expect_float(dlogits, op, "dlogits");
  const int64_t T = shared.size(0), C = shared.size(1);
  if (T == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(ceil_div(T, kWarps), int64_t{sm_count()} * 8)));
  float_switch(shared.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    float_switch(dlogits.dtype, [&](auto out_tag) {
      using TOut = decltype(out_tag);
      shared_gate_backward_kernel<T_, TOut><<<blocks, kThreads, 0, stream()>>>(
          static_cast<const T_*>(dy.data), logits.ptr<float>(), static_cast<const T_*>(shared.data),
          static_cast<T_*>(dshared.data), static_cast<TOut*>(dlogits.data), T, C);
    });
  });
  check_launch("shared_gate_backward_kernel");
}

}  // namespace engine::cuda
