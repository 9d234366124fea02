// Router kernels of the mixture of experts (contract: csrc/ops/moe.h; the CUDA side: moe.cuh).
//   route_forward_kernel   one warp per token (grid-stride): the logits row is copied to the
//     warp's slice of shared memory (so probs may overwrite logits), max and sum of exponentials
//     by warp shuffles, then k rounds of a warp argmax over the logits that skips the experts
//     already taken; a larger logit wins, equal logits go to the lower index (as the reference).
//   aux_losses_kernel      one block of 1024 threads: thread i sums column i % E of probs over
//     the rows i / E, i / E + 1024 / E, ... in double, the partial sums are added in a fixed
//     order, so the result is the same bits every run; the same for lse^2.
//   route_backward_kernel  one warp per token: the weight gradient (through the renormalisation
//     where the forward renormalised) (g_e), the aux term (a constant per expert, kept in shared memory), the softmax backward
//     with a warp sum of p g, and the z term.
//   jitter_kernel          elementwise, Philox counter = element index (as ref::moe_jitter).
// The shared preconditions ran before (ops/moe.cpp); the launchers check what is theirs: the
// routing tensors in f32 (one dtype with logits / probs, checked there), dlogits and the jitter's
// x in bf16 or f32, top_k <= E in the backward.
#include <cfloat>

#include "core/rng.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/warp.cuh"
#include "ops/moe.h"

namespace engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;


static __global__ void route_forward_kernel(const float* logits, float* probs, float* lse,
                                            int32_t* expert_idx, float* weights, int64_t tokens,
                                            int experts, int top_k, bool renormalize) {
  extern __shared__ float s_rows[];  // (kWarps, E)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* row = s_rows + warp * experts;
  for (int64_t t = blockIdx.x * int64_t{kWarps} + warp; t < tokens;
       t += int64_t{gridDim.x} * kWarps) {
    const float* l = logits + t * experts;
    float m = -FLT_MAX;
    for (int e = lane; e < experts; e += 32) {
      row[e] = l[e];
      m = fmaxf(m, row[e]);
    }
    m = warp_max(m);
    float s = 0.f;
    for (int e = lane; e < experts; e += 32) s += expf(row[e] - m);
    const float lse_t = m + logf(warp_sum(s));
    __syncwarp();
    for (int e = lane; e < experts; e += 32) probs[t * experts + e] = expf(row[e] - lse_t);
    int chosen[ops::kMoeMaxTopK];
    float p_sum = 0.f, p_j[ops::kMoeMaxTopK];
    for (int j = 0; j < top_k; ++j) {
      float bv = -INFINITY;
      int bi = INT32_MAX;
      for (int e = lane; e < experts; e += 32) {
        bool taken = false;
        for (int q = 0; q < j; ++q) taken |= chosen[q] == e;
        const float v = row[e];
        if (!taken && (v > bv || (v == bv && e < bi))) {
          bv = v;
          bi = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(kFull, bv, o);
        const int oi = __shfl_xor_sync(kFull, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
          bv = ov;
          bi = oi;
        }
      }
      chosen[j] = bi;
      p_j[j] = expf(bv - lse_t);
      p_sum += p_j[j];
    }
    if (lane < top_k) {
      // Registers indexed by lane: select with a loop so the arrays stay in registers.
      int idx = 0;
      float p = 0.f;
      for (int j = 0; j < top_k; ++j)
        if (j == lane) {
          idx = chosen[j];
          p = p_j[j];
        }
      expert_idx[t * top_k + lane] = idx;
      weights[t * top_k + lane] = renormalize ? p / p_sum : p;
    }
    if (lane == 0) lse[t] = lse_t;
    __syncwarp();  // the row buffer is reused by the next token
  }
}

static __global__ void aux_losses_kernel(const float* probs, const float* lse,
                                         const int32_t* counts, int64_t tokens, int experts,
                                         float aux_coef, float z_coef, float* losses) {
  __shared__ double s_col[1024];
  __shared__ double s_z[1024];
  const int tid = threadIdx.x;
  const int groups = 1024 / experts;
  const int e = tid % experts, g = tid / experts;
  double col = 0, z = 0;
  if (g < groups)
    for (int64_t t = g; t < tokens; t += groups) col += probs[t * experts + e];
  for (int64_t t = tid; t < tokens; t += 1024) z += static_cast<double>(lse[t]) * lse[t];
  s_col[tid] = col;
  s_z[tid] = z;
  __syncthreads();
  for (int half = 512; half > 0; half >>= 1) {  // fixed-order tree for z
    if (tid < half) s_z[tid] += s_z[tid + half];
    __syncthreads();
  }
  if (tid == 0) {
    double total = 0;
    for (int i = 0; i < experts; ++i) total += counts[i];
    double aux = 0;
    if (tokens > 0 && total > 0)
      for (int i = 0; i < experts; ++i) {
        double pe = 0;
        for (int q = 0; q < groups; ++q) pe += s_col[q * experts + i];
        aux += counts[i] / total * pe / static_cast<double>(tokens);
      }
    losses[0] = static_cast<float>(tokens > 0 ? aux * aux_coef * experts : 0.0);
    losses[1] = static_cast<float>(tokens > 0 ? s_z[0] * z_coef / tokens : 0.0);
  }
}

template <typename TOut>
static __global__ void route_backward_kernel(const float* dweights, const float* probs,
                                             const float* lse, const int32_t* expert_idx,
                                             const float* weights, const int32_t* counts,
                                             int64_t tokens, int experts, int top_k, float aux_g,
                                             float z_g, bool renormalize, TOut* dlogits) {
  extern __shared__ float s_aux[];  // (E): aux_g * f_e
  __shared__ float s_total;
  if (threadIdx.x == 0) {
    float total = 0;
    for (int e = 0; e < experts; ++e) total += counts[e];
    s_total = total;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x)
    s_aux[e] = s_total > 0 ? aux_g * (counts[e] / s_total) : 0.f;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t t = blockIdx.x * int64_t{kWarps} + warp; t < tokens;
       t += int64_t{gridDim.x} * kWarps) {
    const float* p = probs + t * experts;
    int my_idx = -1;
    float my_dw = 0.f, my_w = 0.f, my_p = 0.f;
    if (lane < top_k) {
      my_idx = expert_idx[t * top_k + lane];
      my_dw = dweights[t * top_k + lane];
      my_w = weights[t * top_k + lane];
      my_p = p[my_idx];
    }
    const float s = warp_sum(my_p);
    const float wdw = warp_sum(my_w * my_dw);
    // lane j < k: the gradient reaching p[idx_j]
    const float coef = renormalize ? (my_dw - wdw) / s : my_dw;
    int ij[ops::kMoeMaxTopK];
    float cj[ops::kMoeMaxTopK];
#pragma unroll
    for (int j = 0; j < ops::kMoeMaxTopK; ++j) {  // lanes >= k hold idx -1: never matched
      ij[j] = __shfl_sync(kFull, my_idx, j);
      cj[j] = __shfl_sync(kFull, coef, j);
    }
    auto grad = [&](int e) {
      float g = s_aux[e];
#pragma unroll
      for (int j = 0; j < ops::kMoeMaxTopK; ++j)
        if (ij[j] == e) g += cj[j];
      return g;
    };
    float pg = 0.f;
    for (int e = lane; e < experts; e += 32) pg += p[e] * grad(e);
    pg = warp_sum(pg);
    const float zt = z_g * lse[t];
    for (int e = lane; e < experts; e += 32) {
      const float pe = p[e];
      dlogits[t * experts + e] = from_float<TOut>(pe * (grad(e) - pg) + zt * pe);
    }
  }
}

template <typename T>
static __global__ void jitter_kernel(const T* x, T* y, int64_t n, PhiloxKey key, float eps) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t bits = philox4x32(key, static_cast<uint64_t>(i)).v[0];
    const float u = (static_cast<float>(bits) + 1.f) * 0x1p-32f;
    y[i] = from_float<T>(to_float(x[i]) * (1.f + eps * (2.f * u - 1.f)));
  }
}

// t in bf16 or f32.
void expect_float(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}

unsigned token_blocks(int64_t tokens) {
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(ceil_div(tokens, kWarps), int64_t{sm_count()} * 8)));
}

}  // namespace

void moe_route_forward(const Tensor& logits, const Tensor& probs, const Tensor& lse,
                       const Tensor& expert_idx, const Tensor& weights, bool renormalize) {
  const char* op = "moe_route_forward";
  ops::expect_dtype(logits, DType::F32, op, "logits");  // probs, lse, weights: logits' dtype
  const int64_t T = probs.size(0), E = probs.size(1), k = expert_idx.size(1);
  if (T == 0) return;
  const size_t smem = sizeof(float) * kWarps * E;
  route_forward_kernel<<<token_blocks(T), kThreads, smem, stream()>>>(
      logits.ptr<float>(), probs.ptr<float>(), lse.ptr<float>(), expert_idx.ptr<int32_t>(),
      weights.ptr<float>(), T, static_cast<int>(E), static_cast<int>(k), renormalize);
  check_launch("route_forward_kernel");
}

void moe_aux_losses(const Tensor& probs, const Tensor& lse, const Tensor& counts,
                    const ops::MoeAuxCoefs& coefs, const Tensor& losses) {
  const char* op = "moe_aux_losses";
  ops::expect_dtype(probs, DType::F32, op, "probs");  // lse, losses: probs' dtype
  const int64_t T = probs.size(0), E = probs.size(1);
  aux_losses_kernel<<<1, 1024, 0, stream()>>>(probs.ptr<float>(), lse.ptr<float>(),
                                               counts.ptr<int32_t>(), T, static_cast<int>(E),
                                               coefs.aux_loss_coef, coefs.z_loss_coef,
                                               losses.ptr<float>());
  check_launch("aux_losses_kernel");
}

void moe_route_backward(const Tensor& dweights, const Tensor& probs, const Tensor& lse,
                        const Tensor& expert_idx, const Tensor& weights, const Tensor& counts,
                        const ops::MoeAuxCoefs& coefs, float aux_grad_scale, bool renormalize,
                        const Tensor& dlogits) {
  const char* op = "moe_route_backward";
  ops::expect_dtype(probs, DType::F32, op, "probs");  // lse, weights, dweights: probs' dtype
  const int64_t T = probs.size(0), E = probs.size(1), k = expert_idx.size(1);
  ENSURE(k <= E, op, ": top_k = ", k, " > ", E, " experts");
  expect_float(dlogits, op, "dlogits");
  if (T == 0) return;
  const float aux_g = aux_grad_scale * coefs.aux_loss_coef * static_cast<float>(E) / T;
  const float z_g = aux_grad_scale * coefs.z_loss_coef * 2.f / T;
  float_switch(dlogits.dtype, [&](auto tag) {
    using TOut = decltype(tag);
    route_backward_kernel<TOut><<<token_blocks(T), kThreads, sizeof(float) * E, stream()>>>(
        dweights.ptr<float>(), probs.ptr<float>(), lse.ptr<float>(), expert_idx.ptr<int32_t>(),
        weights.ptr<float>(), counts.ptr<int32_t>(), T, static_cast<int>(E), static_cast<int>(k),
        aux_g, z_g, renormalize, static_cast<TOut*>(dlogits.data));
  });
  check_launch("route_backward_kernel");
}

void moe_jitter(const Tensor& x, const Tensor& y, uint64_t seed, float eps) {
  const char* op = "moe_jitter";
  expect_float(x, op, "x");  // y: x's dtype
  const int64_t n = x.numel();
  if (n == 0) return;
  const PhiloxKey key = ops::moe_jitter_key(seed);
  float_switch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    jitter_kernel<T><<<stream_blocks(n, 256), 256, 0, stream()>>>(
        static_cast<const T*>(x.data), static_cast<T*>(y.data), n, key, eps);
  });
  check_launch("jitter_kernel");
}

}  // namespace engine::cuda
