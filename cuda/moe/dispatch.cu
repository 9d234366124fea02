// Dispatch of token rows to experts and back (contract: csrc/ops/moe.h; the CUDA side: moe.cuh).
// The A = T k assignments (t, j), in order a = t k + j, are cut into chunks of kChunk; chunk b
// is handled by block b of both chunk kernels:
//   count_kernel    per-chunk histogram (shared-memory atomics: counts are order free) ->
//                   chunk_counts (B, E)
//   scan_kernel     one block: per expert an exclusive running sum over the chunks, in place
//                   (chunk_counts becomes each chunk's first rank within the expert), the totals
//                   (counts), then the exclusive scan of the padded totals (offsets)
//   rank_kernel     per chunk, in kThreads-wide rounds in assignment order: the rank of an
//                   assignment among the chunk's earlier ones with the same expert is
//                   (earlier rounds: a running count per expert) + (earlier warps of this round:
//                   per-warp counts) + (earlier lanes of this warp: __match_any_sync), so
//                   row_of = offsets_e + chunk base + rank is stable and deterministic.
// No host sync anywhere; the (B, E) scratch comes from the caching allocator.
//   permute_kernel     one block per assignment, the row copied in 16-byte vectors (or
//                      elements when the row length or pointers do not allow vectors)
//   unpermute_kernel   one block per token: y(t) = sum_j w_tj yp(row_tj) in f32
//   unpermute_backward_kernel  one block per token: the scatter of w dy and the k dot products
//                      (per-thread partials, then a fixed-order block reduction)
// The shared preconditions ran before (ops/moe.cpp); the launchers check what is theirs: rows of
// bf16 or f32, the unpermute weights in f32.
#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "ops/moe.h"

namespace engine::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 1024;  // assignments per chunk (4 rounds of kThreads)
constexpr int kWarps = kThreads / 32;
constexpr int kRowThreads = 128;

static __global__ void count_kernel(const int32_t* idx, int64_t assignments, int experts,
                                    int32_t* chunk_counts) {
  extern __shared__ int32_t s_hist[];  // (E)
  for (int e = threadIdx.x; e < experts; e += kThreads) s_hist[e] = 0;
  __syncthreads();
  const int64_t base = int64_t{blockIdx.x} * kChunk;
  for (int i = threadIdx.x; i < kChunk; i += kThreads)
    if (base + i < assignments) atomicAdd(&s_hist[idx[base + i]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kThreads)
    chunk_counts[int64_t{blockIdx.x} * experts + e] = s_hist[e];
}

static __global__ void scan_kernel(int32_t* chunk_counts, int chunks, int experts,
                                   int32_t* counts, int32_t* offsets) {
  __shared__ int32_t s_padded[ops::kMoeMaxExperts];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t run = 0;
    for (int b = 0; b < chunks; ++b) {
      int32_t* c = chunk_counts + int64_t{b} * experts + e;
      const int32_t v = *c;
      *c = run;
      run += v;
    }
    counts[e] = run;
    s_padded[e] = static_cast<int32_t>((run + ops::kMoeRowAlign - 1) / ops::kMoeRowAlign *
                                       ops::kMoeRowAlign);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = run;
      run += s_padded[e];
    }
    offsets[experts] = run;
  }
}

static __global__ void rank_kernel(const int32_t* idx, int64_t assignments, int experts,
                                   const int32_t* chunk_base, const int32_t* offsets,
                                   int32_t* row_of) {
  extern __shared__ int32_t s_mem[];
  int32_t* s_run = s_mem;                 // (E) ranks handed out in earlier rounds
  int32_t* s_warp = s_mem + experts;      // (kWarps, E) this round's count per warp
  int32_t* s_first = s_warp + kWarps * experts;  // (E) offsets_e + chunk base
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    s_run[e] = 0;
    s_first[e] = offsets[e] + chunk_base[int64_t{blockIdx.x} * experts + e];
    for (int w = 0; w < kWarps; ++w) s_warp[w * experts + e] = 0;
  }
  __syncthreads();
  const int64_t base = int64_t{blockIdx.x} * kChunk;
  const unsigned lower = (1u << lane) - 1u;
  for (int round = 0; round < kChunk / kThreads; ++round) {
    const int64_t a = base + round * kThreads + threadIdx.x;
    const bool valid = a < assignments;
    const int e = valid ? idx[a] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const bool leader = (same & lower) == 0;
    if (valid && leader) s_warp[warp * experts + e] = __popc(same);
    __syncthreads();
    if (valid) {
      int32_t rank = s_run[e] + __popc(same & lower);
      for (int w = 0; w < warp; ++w) rank += s_warp[w * experts + e];
      row_of[a] = s_first[e] + rank;
    }
    __syncthreads();
    if (valid && leader) {
      atomicAdd(&s_run[e], __popc(same));
      s_warp[warp * experts + e] = 0;
    }
    __syncthreads();
  }
}

// Copies `n` elements: 16-byte vectors when `vec`, else one element per step.
template <typename T>
__device__ __forceinline__ void copy_row(T* dst, const T* src, int64_t n, bool vec) {
  if (vec) {
    const int64_t nv = n * sizeof(T) / 16;
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  }
}

template <typename T>
static __global__ void permute_kernel(const T* x, const int32_t* row_of, int top_k, int64_t cols,
                                      bool vec, T* xp) {
  const int64_t a = blockIdx.x;
  copy_row(xp + int64_t{row_of[a]} * cols, x + (a / top_k) * cols, cols, vec);
}

// Elements per 16-byte vector.
template <typename T> constexpr int kVec = 16 / sizeof(T);

template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVec<T>]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) v[i] = to_float(e[i]);
}
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[kVec<T>]) {
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) e[i] = from_float<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

template <typename T>
static __global__ void unpermute_kernel(const T* yp, const int32_t* row_of, const float* weights,
                                        int top_k, int64_t cols, bool vec, T* y) {
  const int64_t t = blockIdx.x;
  int32_t rows[ops::kMoeMaxTopK];
  float w[ops::kMoeMaxTopK];
  for (int j = 0; j < top_k; ++j) {
    rows[j] = row_of[t * top_k + j];
    w[j] = weights ? weights[t * top_k + j] : 1.f;
  }
  if (vec) {
    constexpr int V = kVec<T>;
    for (int64_t i = threadIdx.x; i < cols / V; i += blockDim.x) {
      float acc[V] = {}, v[V];
      for (int j = 0; j < top_k; ++j) {
        load_vec(yp + int64_t{rows[j]} * cols + i * V, v);
#pragma unroll
        for (int q = 0; q < V; ++q) acc[q] += w[j] * v[q];
      }
      store_vec(y + t * cols + i * V, acc);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float acc = 0.f;
      for (int j = 0; j < top_k; ++j) acc += w[j] * to_float(yp[int64_t{rows[j]} * cols + c]);
      y[t * cols + c] = from_float<T>(acc);
    }
  }
}

template <typename T>
static __global__ void unpermute_backward_kernel(const T* dy, const T* yp, const int32_t* row_of,
                                                 const float* weights, int top_k, int64_t cols,
                                                 bool vec, T* dyp, float* dweights) {
  __shared__ float s_part[kRowThreads / 32][ops::kMoeMaxTopK];
  const int64_t t = blockIdx.x;
  int32_t rows[ops::kMoeMaxTopK];
  float w[ops::kMoeMaxTopK], dot[ops::kMoeMaxTopK] = {};
  for (int j = 0; j < top_k; ++j) {
    rows[j] = row_of[t * top_k + j];
    w[j] = weights[t * top_k + j];
  }
  if (vec) {
    constexpr int V = kVec<T>;
    for (int64_t i = threadIdx.x; i < cols / V; i += blockDim.x) {
      float g[V], v[V], o[V];
      load_vec(dy + t * cols + i * V, g);
      for (int j = 0; j < top_k; ++j) {
        load_vec(yp + int64_t{rows[j]} * cols + i * V, v);
#pragma unroll
        for (int q = 0; q < V; ++q) {
          dot[j] += g[q] * v[q];
          o[q] = w[j] * g[q];
        }
        store_vec(dyp + int64_t{rows[j]} * cols + i * V, o);
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float g = to_float(dy[t * cols + c]);
      for (int j = 0; j < top_k; ++j) {
        dot[j] += g * to_float(yp[int64_t{rows[j]} * cols + c]);
        dyp[int64_t{rows[j]} * cols + c] = from_float<T>(w[j] * g);
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = 0; j < top_k; ++j) {
    float v = dot[j];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) s_part[warp][j] = v;
  }
  __syncthreads();
  if (threadIdx.x < top_k) {
    float s = 0.f;
    for (int q = 0; q < kRowThreads / 32; ++q) s += s_part[q][threadIdx.x];
    dweights[t * top_k + threadIdx.x] = s;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// t in bf16 or f32.
void expect_float(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}

}  // namespace

void moe_dispatch(const Tensor& expert_idx, const Tensor& counts, const Tensor& offsets,
                  const Tensor& row_of) {
  const int64_t T = expert_idx.size(0), k = expert_idx.size(1), E = counts.size(0);
  const int64_t A = T * k;
  const int64_t chunks = std::max<int64_t>(1, ceil_div(A, kChunk));
  Owned scratch = empty({chunks, E}, DType::I32, Device::CUDA);
  const int e = static_cast<int>(E);
  count_kernel<<<chunks, kThreads, sizeof(int32_t) * E, stream()>>>(expert_idx.ptr<int32_t>(), A,
                                                                    e, scratch.ptr<int32_t>());
  check_launch("count_kernel");
  scan_kernel<<<1, 1024, 0, stream()>>>(scratch.ptr<int32_t>(), static_cast<int>(chunks), e,
                                        counts.ptr<int32_t>(), offsets.ptr<int32_t>());
  check_launch("scan_kernel");
  if (A == 0) return;
  rank_kernel<<<chunks, kThreads, sizeof(int32_t) * E * (kWarps + 2), stream()>>>(
      expert_idx.ptr<int32_t>(), A, e, scratch.ptr<int32_t>(), offsets.ptr<int32_t>(),
      row_of.ptr<int32_t>());
  check_launch("rank_kernel");
}

void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor& xp) {
  expect_float(x, "moe_permute", "x");  // xp: x's dtype
  const int64_t T = x.size(0), C = x.size(1), k = row_of.size(1);
  if (T == 0 || C == 0) return;
  const bool vec = (C * dtype_size(x.dtype)) % 16 == 0 && aligned16(x.data) && aligned16(xp.data);
  float_switch(x.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    permute_kernel<T_><<<static_cast<unsigned>(T * k), kRowThreads, 0, stream()>>>(
        static_cast<const T_*>(x.data), row_of.ptr<int32_t>(), static_cast<int>(k), C, vec,
        static_cast<T_*>(xp.data));
  });
  check_launch("permute_kernel");
}

void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& y) {
  const char* op = "moe_unpermute";
  expect_float(y, op, "y");  // yp: y's dtype
  const int64_t T = y.size(0), C = y.size(1), k = row_of.size(1);
  const bool weighted = weights.data != nullptr;
  if (weighted) ops::expect_dtype(weights, DType::F32, op, "weights");
  if (T == 0) return;
  const bool vec = (C * dtype_size(y.dtype)) % 16 == 0 && aligned16(y.data) && aligned16(yp.data);
  float_switch(y.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    unpermute_kernel<T_><<<static_cast<unsigned>(T), kRowThreads, 0, stream()>>>(
        static_cast<const T_*>(yp.data), row_of.ptr<int32_t>(),
        weighted ? weights.ptr<float>() : nullptr, static_cast<int>(k), C, vec,
        static_cast<T_*>(y.data));
  });
  check_launch("unpermute_kernel");
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& weights, const Tensor& dyp, const Tensor& dweights) {
  const char* op = "moe_unpermute_backward";
  expect_float(dy, op, "dy");  // yp, dyp: dy's dtype
  ops::expect_dtype(weights, DType::F32, op, "weights");
  ops::expect_dtype(dweights, DType::F32, op, "dweights");
  const int64_t T = dy.size(0), C = dy.size(1), k = row_of.size(1);
  if (T == 0) return;
  const bool vec = (C * dtype_size(dy.dtype)) % 16 == 0 && aligned16(dy.data) &&
                   aligned16(yp.data) && aligned16(dyp.data);
  float_switch(dy.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    unpermute_backward_kernel<T_><<<static_cast<unsigned>(T), kRowThreads, 0, stream()>>>(
        static_cast<const T_*>(dy.data), static_cast<const T_*>(yp.data), row_of.ptr<int32_t>(),
        weights.ptr<float>(), static_cast<int>(k), C, vec, static_cast<T_*>(dyp.data),
        dweights.ptr<float>());
  });
  check_launch("unpermute_backward_kernel");
}

}  // namespace engine::cuda
