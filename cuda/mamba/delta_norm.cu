// The Gated DeltaNet ops (ops/delta.h) other than the chunked rule: the per-head gated norm both
// ways and the one-token step of text generation.
//   head_rmsnorm_gated forward: one warp per (token, head) row of head_dim columns (8 rows a
//     block), lanes striding the row's columns: sum y^2 by a shuffle tree, rstd from it, then
//     out = w (y rstd) silu(z) per element.
//   backward: the same rows, a block taking a group of kGroupRows rows (kGroupRows / 8 a warp):
//     dot = sum w silu(z) dout y per row (a shuffle tree), dy and dz per element; each warp adds
//     its rows' dweight terms into its own shared-memory row (a lane owns its columns), the block
//     sums its 8 warps' rows in warp order into a (groups, head_dim) f32 scratch, and a second
//     kernel adds the groups' partials into dweight in group order.
//   gated_delta_step: one block per value head, one thread per value column j (it alone reads and
//     writes column j of the head's dk x dv state): the block l2-normalises the key head's q and
//     k into shared memory (warp 0's shuffle tree), then thread j decays its column, takes
//     u = S'^T k^ for its column, delta = beta (v_j - u), S += k^ delta and o_j = S^T q^. The
//     gates and norms by the library's accurate expf, log1pf and sqrtf (one token: no throughput
//     to win with the polynomials of the training kernels), as the Mamba step (decode_step.cu).
// Every sum is f32 in a fixed order: reproducible bit for bit.
// Memory: activations (y, z, dout, out, dy, dz; q, k, v, a, b, o) bf16 column blocks of any
// alignment (scalar accesses), weight, A_log and dt_bias bf16, rstd f32 (T, heads), dweight f32
// (head_dim) +=, the state f32 (Hv, dk, dv). The shared checks ran (ops/delta.cpp; they put every
// activation and weight in y's or A_log's dtype); here: the dtypes and the kernels' limits.
#include <cmath>

#include "cuda/mamba/common.cuh"
#include "ops/delta.h"

namespace engine::cuda {
namespace {

using namespace mamba;

constexpr int kWarps = 8;             // (token, head) rows in flight a block: one a warp
constexpr int64_t kGroupRows = 64;    // rows a backward block takes (8 a warp): 64k rows, 1k groups
constexpr int kMaxHeadDim = 1024;     // the norm backward's (8, head_dim) f32 sums: 32 KB of shared memory
constexpr int kMaxValueDim = 1024;    // the step's threads a block
constexpr int kMaxKeyDim = 4096;      // the step's q^, k^: 32 KB of shared memory
constexpr float kL2Eps = 1e-6f;       // the l2 norms' epsilon (inside the sqrt, as ref/delta.cpp)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row r = t heads + h of a (T, heads x d) block: its d columns start at column h d of row t.
template <typename P>
struct HeadRows {
  P* p;
  int64_t ld, heads, d;
  __device__ __forceinline__ P* row(int64_t r) const { return p + (r / heads) * ld + (r % heads) * d; }
};
template <typename P>
HeadRows<P> head_rows(const ops::ColumnBlock& b, int64_t d) {
  return {block_ptr<P>(b), b.ld(), b.width / d, d};
}

__global__ void __launch_bounds__(kWarps * 32)
    head_norm_forward_kernel(HeadRows<const bf16_t> y, HeadRows<const bf16_t> z, const bf16_t* __restrict__ w,
                             int64_t rows, float eps, HeadRows<bf16_t> out, float* __restrict__ rstd) {
  const int64_t r = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (r >= rows) return;  // the whole warp
  const int lane = threadIdx.x % 32, d = static_cast<int>(y.d);
  const bf16_t *yr = y.row(r), *zr = z.row(r);
  float ss = 0.f;
  for (int i = lane; i < d; i += 32) ss = fmaf(bf(yr[i]), bf(yr[i]), ss);
  const float rs = rsqrtf(warp_sum(ss) / static_cast<float>(d) + eps);
  if (lane == 0) rstd[r] = rs;
  bf16_t* o = out.row(r);
  for (int i = lane; i < d; i += 32) {
    const float zv = bf(zr[i]);
    o[i] = __float2bfloat16(bf(w[i]) * (bf(yr[i]) * rs) * (zv * sigmoid_f(zv)));
  }
}

// dy = rstd u - y rstd^3 dot / d, dz = dout w y rstd silu'(z), with u = w silu(z) dout and
// dot = sum u y over the row; dweight's terms dout y rstd silu(z) into the group's partial.
__global__ void __launch_bounds__(kWarps * 32)
    head_norm_backward_kernel(HeadRows<const bf16_t> dout, HeadRows<const bf16_t> y, HeadRows<const bf16_t> z,
                              const bf16_t* __restrict__ w, const float* __restrict__ rstd, int64_t rows,
                              HeadRows<bf16_t> dy, HeadRows<bf16_t> dz, float* __restrict__ partial) {
  extern __shared__ float sums[];  // (kWarps, d): warp i's dweight terms in row i
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = static_cast<int>(y.d);
  float* mine = sums + warp * d;
  for (int i = lane; i < d; i += 32) mine[i] = 0.f;
  const int64_t r1 = min(rows, (blockIdx.x + int64_t{1}) * kGroupRows);
  for (int64_t r = blockIdx.x * kGroupRows + warp; r < r1; r += kWarps) {
    const bf16_t *gr = dout.row(r), *yr = y.row(r), *zr = z.row(r);
    const float rs = rstd[r];
    float dot = 0.f;
    for (int i = lane; i < d; i += 32) {
      const float zv = bf(zr[i]);
      dot = fmaf(bf(w[i]) * (zv * sigmoid_f(zv)) * bf(gr[i]), bf(yr[i]), dot);
    }
    const float c = rs * rs * rs * warp_sum(dot) / static_cast<float>(d);
    bf16_t *dyr = dy.row(r), *dzr = dz.row(r);
    for (int i = lane; i < d; i += 32) {
      const float yv = bf(yr[i]), zv = bf(zr[i]), go = bf(gr[i]), wi = bf(w[i]);
      const float s = sigmoid_f(zv), u = wi * (zv * s) * go;
      dyr[i] = __float2bfloat16(rs * u - yv * c);
      dzr[i] = __float2bfloat16(go * wi * yv * rs * dsilu(zv, s));
      mine[i] = fmaf(go * yv * rs, zv * s, mine[i]);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < d; i += kWarps * 32) {
    float s = 0.f;
    for (int k = 0; k < kWarps; ++k) s += sums[k * d + i];
    partial[blockIdx.x * int64_t{d} + i] = s;
  }
}

// dweight[i] += the groups' partials: warp k sums groups k, k + 8, ..., then the 8 warps' sums in
// warp order (32 columns a block).
__global__ void __launch_bounds__(kWarps * 32)
    head_norm_dweight_kernel(const float* __restrict__ partial, int64_t groups, int d, float* __restrict__ dweight) {
  __shared__ float warp_sums[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, i = blockIdx.x * 32 + lane;
  float s = 0.f;
  if (i < d)
    for (int64_t g = warp; g < groups; g += kWarps) s += partial[g * d + i];
  warp_sums[warp][lane] = s;
  __syncthreads();
  if (warp != 0 || i >= d) return;
  float total = 0.f;
  for (int k = 0; k < kWarps; ++k) total += warp_sums[k][lane];
  dweight[i] += total;
}

int head_dim(const char* op, const Tensor& weight) {
  const int64_t d = weight.size(0);
  ENSURE(d <= kMaxHeadDim, op, ": head_dim ", d, " is larger than the kernels take (", kMaxHeadDim, ")");
  return static_cast<int>(d);
}

struct StepArgs {
  const bf16_t *q, *k;                        // key head i at [i dk, (i + 1) dk)
  const bf16_t *v, *a, *b, *A_log, *dt_bias;  // v: value head h at [h dv, (h + 1) dv); the rest at [h]
  float* state;                               // (Hv, dk, dv)
  bf16_t* o;                                  // value head h at [h dv, (h + 1) dv)
  int per_key, dk, dv;
  float scale;  // 1 / sqrt(dk)
};

__global__ void __launch_bounds__(kMaxValueDim) gated_delta_step_kernel(const StepArgs p) {
  extern __shared__ float qk[];  // q^ (dk), then k^ (dk)
  __shared__ float inv[2];       // scale / |q|, 1 / |k|
  const int h = blockIdx.x, kh = h / p.per_key, j = threadIdx.x;
  for (int i = j; i < p.dk; i += blockDim.x) {
    qk[i] = bf(p.q[int64_t{kh} * p.dk + i]);
    qk[p.dk + i] = bf(p.k[int64_t{kh} * p.dk + i]);
  }
  __syncthreads();
  if (j < 32) {
    float sq = 0.f, sk = 0.f;
    for (int i = j; i < p.dk; i += 32) {
      sq = fmaf(qk[i], qk[i], sq);
      sk = fmaf(qk[p.dk + i], qk[p.dk + i], sk);
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    if (j == 0) {
      inv[0] = p.scale / sqrtf(sq + kL2Eps);
      inv[1] = 1.f / sqrtf(sk + kL2Eps);
    }
  }
  __syncthreads();
  for (int i = j; i < p.dk; i += blockDim.x) {
    qk[i] *= inv[0];
    qk[p.dk + i] *= inv[1];
  }
  __syncthreads();
  if (j >= p.dv) return;
  const float* qh = qk;
  const float* kn = qk + p.dk;
  const float beta = 1.f / (1.f + expf(-bf(p.b[h])));
  const float x = bf(p.a[h]) + bf(p.dt_bias[h]);
  const float softplus = x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x));
  const float e = expf(-expf(bf(p.A_log[h])) * softplus);  // exp(g)
  float* S = p.state + int64_t{h} * p.dk * p.dv + j;     // S[i, j] at S[i dv]
  float u = 0.f;
#pragma unroll 4
  for (int i = 0; i < p.dk; ++i) u = fmaf(e * S[int64_t{i} * p.dv], kn[i], u);
  const float delta = beta * (bf(p.v[int64_t{h} * p.dv + j]) - u);
  float acc = 0.f;
#pragma unroll 4
  for (int i = 0; i < p.dk; ++i) {
    const float s = fmaf(kn[i], delta, e * S[int64_t{i} * p.dv]);
    S[int64_t{i} * p.dv] = s;
    acc = fmaf(s, qh[i], acc);
  }
  p.o[int64_t{h} * p.dv + j] = __float2bfloat16(acc);
}

}  // namespace

void head_rmsnorm_gated_forward(const ops::ColumnBlock& y, const ops::ColumnBlock& z, const Tensor& weight, float eps,
                                const ops::ColumnBlock& out, const Tensor& rstd) {
  const char* op = "head_rmsnorm_gated_forward";
  expect_bf16(y.base, op, "y");  // z, weight and out were checked to be in y's dtype
  const int d = head_dim(op, weight);
  const int64_t heads = y.width / d, rows = y.rows() * heads;
  expect_cuda(rstd, DType::F32, {y.rows(), heads}, op, "rstd");
  if (rows == 0) return;
  head_norm_forward_kernel<<<static_cast<unsigned>(ceil_div(rows, kWarps)), kWarps * 32, 0, stream()>>>(
      head_rows<const bf16_t>(y, d), head_rows<const bf16_t>(z, d), static_cast<const bf16_t*>(weight.data), rows,
      eps, head_rows<bf16_t>(out, d), static_cast<float*>(rstd.data));
  check_launch("head_norm_forward_kernel");
}

void head_rmsnorm_gated_backward(const ops::ColumnBlock& dout, const ops::ColumnBlock& y, const ops::ColumnBlock& z,
                                 const Tensor& weight, const Tensor& rstd, const ops::ColumnBlock& dy,
                                 const ops::ColumnBlock& dz, const Tensor& dweight) {
  const char* op = "head_rmsnorm_gated_backward";
  expect_bf16(y.base, op, "y");  // dout, z, weight, dy and dz were checked to be in y's dtype
  const int d = head_dim(op, weight);
  const int64_t heads = y.width / d, rows = y.rows() * heads;
  expect_cuda(rstd, DType::F32, {y.rows(), heads}, op, "rstd");
  expect_cuda(dweight, DType::F32, {d}, op, "dweight");
  if (rows == 0) return;
  const int64_t groups = ceil_div(rows, kGroupRows);
  Owned partial = empty({groups, d}, DType::F32, Device::CUDA);
  head_norm_backward_kernel<<<static_cast<unsigned>(groups), kWarps * 32, kWarps * d * sizeof(float), stream()>>>(
      head_rows<const bf16_t>(dout, d), head_rows<const bf16_t>(y, d), head_rows<const bf16_t>(z, d),
      static_cast<const bf16_t*>(weight.data), static_cast<const float*>(rstd.data), rows, head_rows<bf16_t>(dy, d),
      head_rows<bf16_t>(dz, d), static_cast<float*>(partial.t.data));
  check_launch("head_norm_backward_kernel");
  head_norm_dweight_kernel<<<static_cast<unsigned>(ceil_div(d, 32)), kWarps * 32, 0, stream()>>>(
      static_cast<const float*>(partial.t.data), groups, d, static_cast<float*>(dweight.data));
  check_launch("head_norm_dweight_kernel");
}

void gated_delta_step(const ops::DeltaArgs& a, const Tensor& state, const ops::ColumnBlock& o) {
  const char* op = "gated_delta_step";
  expect_bf16(a.A_log, op, "A_log");  // q, k, v, a, b, dt_bias and o were checked to be in A_log's dtype
  const int64_t hv = a.A_log.size(0), hk = a.key_heads, dk = a.q.width / hk, dv = a.v.width / hv;
  expect_cuda(state, DType::F32, {hv, dk, dv}, op, "state");
  ENSURE(dk <= kMaxKeyDim && dv <= kMaxValueDim, op, ": head dims ", dk, " / ", dv,
         " are larger than the kernel takes (", kMaxKeyDim, " / ", kMaxValueDim, ")");
  const StepArgs p{block_ptr<const bf16_t>(a.q), block_ptr<const bf16_t>(a.k), block_ptr<const bf16_t>(a.v),
                   block_ptr<const bf16_t>(a.a), block_ptr<const bf16_t>(a.b),
                   static_cast<const bf16_t*>(a.A_log.data), static_cast<const bf16_t*>(a.dt_bias.data),
                   static_cast<float*>(state.data), block_ptr<bf16_t>(o), static_cast<int>(hv / hk),
                   static_cast<int>(dk), static_cast<int>(dv), static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)))};
  const int threads = static_cast<int>(ceil_div(dv, 32) * 32);
  gated_delta_step_kernel<<<static_cast<unsigned>(hv), threads, 2 * dk * sizeof(float), stream()>>>(p);
  check_launch("gated_delta_step_kernel");
}

}  // namespace engine::cuda
