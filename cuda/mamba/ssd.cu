// The Mamba-2 scan forward and its one-token step (ops/ssd.h) on the GPU, in the chunked form of
// ssd_impl.cuh. Three kernels, as the Mamba scan's (scan.cu):
//   1. chunk summary: each (chunk c < chunks - 1, head) runs its chunk's sub-chunks from a zero
//      state; its end state goes into chunk_states[c + 1], the product of its sub-chunks'
//      carries (0: a document starts in it) into factors;
//   2. state pass: each state element walks the chunks in order, entering state of chunk c + 1 =
//      factor c x entering state of c + summary c (chunk_states, kept for the backward);
//   3. output: each (chunk, head) runs its sub-chunks from its entering state and writes y.
// Per sub-chunk, output: Y = C S^T scaled by the rows' from_s, + (C B^T * decays * delta) x, + D x
// (x exact in bf16, delta folded into the one rounded matrix); the
// state S = carry S + U_w^T B (U_w: u scaled by to_e). S is f32 in shared memory, rounded to bf16
// for the C S^T product.
// Memory: x, dt, B, C, y bf16 column blocks (any alignment: scalar loads), A_log, D, dt_bias bf16,
// chunk_states f32 (chunks, H, P, N), any alignment.
#include "ops/ssd.h"

#include "cuda/mamba/ssd_impl.cuh"

namespace engine::cuda {
namespace {

using namespace ssd_impl;

template <int PP, int NP> struct FwdLayout {
  static constexpr int LB = NP + kPadB, LU = PP + kPadB, LM = kSub + kPadF, LMB = kSub + kPadB, LS = NP + kPadF,
                       LY = PP + kPadF;
  static constexpr size_t bytes() {
    return 2 * carve_bytes(kSub * LB * 2) + 2 * carve_bytes(kSub * LU * 2) + carve_bytes(kSub * LM * 4) +
           carve_bytes(kSub * LMB * 2) + carve_bytes(size_t{PP} * LS * 4) + carve_bytes(size_t{PP} * LB * 2) +
           carve_bytes(kSub * LY * 4) + carve_bytes(sizeof(SubTokens));
  }
};

// kOutput false: step 1 (blockIdx.x = c < chunks - 1); true: step 3 (c < chunks).
template <int PP, int NP, bool kOutput>
__global__ void __launch_bounds__(kThreads) ssd_chunk_kernel(SsdParams p, float* __restrict__ states,
                                                             float* __restrict__ factors, bf16_t* __restrict__ y,
                                                             int64_t ldy) {
  using L = FwdLayout<PP, NP>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Cs = cv.take<bf16_t>(kSub * L::LB), *Bs = cv.take<bf16_t>(kSub * L::LB);
  bf16_t *Xs = cv.take<bf16_t>(kSub * L::LU), *Uw = cv.take<bf16_t>(kSub * L::LU);
  float* Mf = cv.take<float>(kSub * L::LM);
  bf16_t* Mb = cv.take<bf16_t>(kSub * L::LMB);
  float* S = cv.take<float>(PP * L::LS);
  bf16_t* Sb = cv.take<bf16_t>(PP * L::LB);
  float* Y = cv.take<float>(kSub * L::LY);
  SubTokens& tok = *cv.take<SubTokens>(1);

  const int c = blockIdx.x, h = blockIdx.y, g = h / p.hpg, P = p.P, N = p.N;
  const float A = -__expf(bf(p.alog[h])), bias = bf(p.bias[h]), Dh = bf(p.D[h]);
  const int64_t PN = int64_t{P} * N;
  const float* enter = states + (int64_t{c} * p.H + h) * PN;
  for (int i = threadIdx.x; i < PP * NP; i += kThreads) {
    const int r = i / NP, n = i % NP;
    S[r * L::LS + n] = kOutput && r < P && n < N ? enter[r * N + n] : 0.f;
  }
  float total = 1.f;
  const int64_t c0 = int64_t{c} * p.chunk, cend = min(c0 + p.chunk, p.T);
  for (int64_t t0 = c0; t0 < cend; t0 += kSub) {
    const bool update = !kOutput || t0 + kSub < cend;  // the state is needed past this sub-chunk
    // One round of loads: warp 0's per-token values beside everyone's tiles.
    prepare_tokens(p, h, t0, A, bias, tok);
    if (kOutput) load_rows<NP>(Cs, L::LB, p.C, p.ldc, t0, p.T, g * N, N, nullptr);
    load_rows<NP>(Bs, L::LB, p.B, p.ldb, t0, p.T, g * N, N, nullptr);
    load_rows<PP>(Xs, L::LU, p.x, p.ldx, t0, p.T, h * P, P, nullptr);  // x, exact
    if (kOutput)
      for (int i = threadIdx.x; i < PP * NP; i += kThreads)
        Sb[i / NP * L::LB + i % NP] = __float2bfloat16(S[i / NP * L::LS + i % NP]);
    __syncthreads();
    if (kOutput) {
      tile_mma<kSub, PP, NP, RowM, ColM>(Cs, L::LB, Sb, L::LB, Y, L::LY, 0.f);   // C S^T
      tile_mma<kSub, kSub, NP, RowM, ColM>(Cs, L::LB, Bs, L::LB, Mf, L::LM, 0.f); // C B^T
      __syncthreads();
      for (int i = threadIdx.x; i < kSub * kSub; i += kThreads) {
        const int t = i / kSub, s = i % kSub;
        Mb[t * L::LMB + s] = __float2bfloat16(Mf[t * L::LM + s] * sub_decay(tok, t, s) * tok.delta[s]);
      }
      for (int i = threadIdx.x; i < kSub * PP; i += kThreads) Y[i / PP * L::LY + i % PP] *= tok.from_s[i / PP];
    }
    if (update)  // U_w = x delta to_e, rounded once
      for (int i = threadIdx.x; i < kSub * PP; i += kThreads) {
        const int t = i / PP, q = i % PP;
        Uw[t * L::LU + q] = __float2bfloat16(bf(Xs[t * L::LU + q]) * tok.delta[t] * tok.to_e[t]);
      }
    __syncthreads();
    const float carry = tok.carry;
    if (kOutput) tile_mma<kSub, PP, kSub, RowM, RowM>(Mb, L::LMB, Xs, L::LU, Y, L::LY, 1.f);
    if (update) tile_mma<PP, NP, kSub, ColM, RowM>(Uw, L::LU, Bs, L::LB, S, L::LS, carry);
    total *= carry;
    __syncthreads();
    if (kOutput) {
      for (int i = threadIdx.x; i < kSub * P; i += kThreads) {
        const int t = i / P, q = i % P;
        const int64_t row = t0 + t;
        if (row < p.T) y[row * ldy + h * P + q] = __float2bfloat16(Y[t * L::LY + q] + Dh * bf(Xs[t * L::LU + q]));
      }
      __syncthreads();  // Y and Xs read before the next sub-chunk's loads
    }
  }
  if (!kOutput) {
    float* out = states + (int64_t{c + 1} * p.H + h) * PN;
    for (int i = threadIdx.x; i < P * N; i += kThreads) out[i] = S[i / N * L::LS + i % N];
    if (threadIdx.x == 0) factors[int64_t{c} * p.H + h] = total;
  }
}

// One token per head from the cached state (H, P, N) f32: a block per head, a thread per channel.
__global__ void ssd_step_kernel(SsdParams p, float* __restrict__ state, bf16_t* __restrict__ y) {
  const int h = blockIdx.x, g = h / p.hpg, N = p.N;
  float pre = bf(p.dt[h]) + bf(p.bias[h]);
  float delta = softplus_f(pre);
  delta = fmaxf(delta, p.dt_min);
  if (p.dt_max > 0.f) delta = fminf(delta, p.dt_max);
  const float decay = __expf(delta * -__expf(bf(p.alog[h]))), Dh = bf(p.D[h]);
  for (int q = threadIdx.x; q < p.P; q += blockDim.x) {
    const float u = bf(p.x[h * p.P + q]);
    float* S = state + (int64_t{h} * p.P + q) * N;
    float acc = 0.f;
    for (int n = 0; n < N; ++n) {
      const float v = decay * S[n] + delta * u * bf(p.B[g * N + n]);
      S[n] = v;
      acc += v * bf(p.C[g * N + n]);
    }
    y[h * p.P + q] = __float2bfloat16(acc + Dh * u);
  }
}

}  // namespace

void ssd_scan_forward(const ops::SsdArgs& a, const ops::ColumnBlock& y, const Tensor& chunk_states) {
  const char* op = "ssd_scan_forward";
  check_ssd_cuda(op, a);
  expect_bf16(y.base, op, "y");
  ENSURE(chunk_states.dtype == DType::F32, op, ": chunk_states is ", dtype_name(chunk_states.dtype), ", expected f32");
  const int64_t T = a.x.rows();
  if (T == 0) return;
  Owned bits = doc_start_bits(a.cu_seqlens, T);
  const SsdParams p = ssd_params(a, static_cast<const uint32_t*>(bits.t.data));
  float* states = static_cast<float*>(chunk_states.data);
  const int64_t PN = int64_t{p.P} * p.N;
  with_dims(p.P, p.N, [&]<int PP, int NP>() {
    const size_t smem = FwdLayout<PP, NP>::bytes();
    Owned factors = empty({std::max(p.chunks - 1, 1) * int64_t{p.H}}, DType::F32, Device::CUDA);
    if (p.chunks > 1) {
      auto summary = ssd_chunk_kernel<PP, NP, false>;
      allow_smem(summary, smem);
      summary<<<dim3(p.chunks - 1, p.H), kThreads, smem, stream()>>>(p, states, static_cast<float*>(factors.t.data),
                                                                      nullptr, 0);
      check_launch("ssd_chunk_kernel (summary)");
    }
    ssd_pass(states, static_cast<const float*>(factors.t.data), p.chunks, p.H, PN, false);  // step 2
    auto output = ssd_chunk_kernel<PP, NP, true>;
    allow_smem(output, smem);
    output<<<dim3(p.chunks, p.H), kThreads, smem, stream()>>>(p, states, nullptr, block_ptr<bf16_t>(y), y.ld());
    check_launch("ssd_chunk_kernel (output)");
  });
}

void ssd_scan_step(const ops::SsdArgs& a, const Tensor& state, const ops::ColumnBlock& y) {
  const char* op = "ssd_scan_step";
  expect_bf16(a.x.base, op, "x");
  expect_bf16(y.base, op, "y");
  ENSURE(state.dtype == DType::F32, op, ": state is ", dtype_name(state.dtype), ", expected f32");
  const SsdParams p = ssd_params(a, nullptr);
  ssd_step_kernel<<<p.H, 128, 0, stream()>>>(p, static_cast<float*>(state.data), block_ptr<bf16_t>(y));
  check_launch("ssd_step_kernel");
}

}  // namespace engine::cuda
