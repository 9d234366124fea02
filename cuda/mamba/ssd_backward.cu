// The Mamba-2 scan backward (ops/ssd.h) on the GPU, in the chunked form of ssd_impl.cuh. With dS
// the gradient of the state at the end of a sub-chunk (of a chunk: dS_end), per sub-chunk of one
// head (CB = C B^T, Mb the masked decays times CB, Gm = dY U^T, dCB = Gm times the decays; the
// products with U = delta x take x, exact in bf16, and scale by delta in f32):
//   du = Mb^T dY + to_e (B dS^T),            dx = delta du + D dy
//   dC = dCB B + from_s (dY S0),             dB = dCB^T C + to_e (U dS)
//   dS at the sub-chunk's start = carry dS + (from_s dY)^T C
//   d cum[t] = sum_s dCB CB [t, s] - sum_s dCB CB [s, t] + from_s C[t] . (S0^T dy[t])
//              - u[t] . (to_e B[t] dS^T) [+ at the end: the same summed over t, + carry <dS, S0>]
//   d a = reverse cumulative sum of d cum,  ddelta = d a A + x . du,  dA = sum d a delta
// Kernels:
//   1. dstate summary: each (chunk c >= 1, head) runs its sub-chunks in reverse from dS = 0 and
//      writes the gradient reaching its entering state into dS_end[c - 1], its carry product;
//   2. dstate pass: each element walks the chunks in reverse: dS_end[c - 1] += factor c dS_end[c];
//   3. main: each (chunk, group, slice of the group's heads) runs, per head in order, the
//      sub-chunks forward from chunk_states (their entering states into a scratch area of the
//      block) and then in reverse from dS_end with the formulas above; dB and dC sum over the
//      slice's heads in order into f32 partial sums of the slice;
//   4. reductions: dB and dC over the slices, the parameter gradients over the chunks, in order.
// Every sum runs in a fixed order: the results are reproducible bit for bit. The slice count
// depends on the shape only (ops::ssd_backward_slices).
// Workspaces (f32): dS_end and the entering states padded to PP x NP per (chunk, head) and per
// (block, sub-chunk), dB and dC partials (slices, T, G N), parameter partials (chunks, H, 3).
#include "ops/ssd.h"

#include "cuda/mamba/ssd_impl.cuh"

namespace engine::cuda {
namespace {

using namespace ssd_impl;

struct BwdOut {
  const bf16_t* dy;
  int64_t lddy;
  bf16_t *dx, *ddt;
  int64_t lddx, ldddt;
  const float* states;  // chunk_states (chunks, H, P, N)
  float* dsend;         // (chunks, H, PP, NP)
  float* scratch;       // (blocks, chunk / kSub, PP, NP)
  float* part;          // dB then dC partials: (2, slices, T, G N)
  float* pgrad;         // (chunks, H, 3): dA_log, dD, ddt_bias
  int slices;
};

template <int PP, int NP> struct BwdLayout {
  static constexpr int LB = NP + kPadB, LU = PP + kPadB, LM = kSub + kPadF, LMB = kSub + kPadB, LS = NP + kPadF,
                       LY = PP + kPadF;
  // Mb, dCBb and dYc live in S0b's area: S0b's one reader (dY S0) is behind the barrier before
  // they are written (as the scratch U_w of the recomputation, which has no S0b). Two blocks fit
  // a multiprocessor at PP 64, NP 128 (112 KB).
  static constexpr size_t s0_bytes() {
    const size_t own = carve_bytes(size_t{PP} * LB * 2), lodgers = 2 * carve_bytes(kSub * LMB * 2) + carve_bytes(kSub * LU * 2);
    return own > lodgers ? own : lodgers;
  }
  static constexpr size_t bytes() {
    return 2 * carve_bytes(kSub * LB * 2) + 2 * carve_bytes(kSub * LU * 2) + 2 * s0_bytes() +
           2 * carve_bytes(kSub * LM * 4) + carve_bytes(kSub * LY * 4) + 2 * carve_bytes(kSub * LS * 4) +
           carve_bytes(sizeof(SubTokens)) + carve_bytes(6 * kSub * 4 + 64);
  }
};

// Step 1 (blockIdx.x + 1 = c): the gradient reaching chunk c's entering state from its own tokens.
template <int PP, int NP>
__global__ void __launch_bounds__(kThreads) ssd_dstate_kernel(SsdParams p, BwdOut o, float* __restrict__ factors) {
  constexpr int LB = NP + kPadB, LU = PP + kPadB;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Cs = cv.take<bf16_t>(kSub * LB), *dYc = cv.take<bf16_t>(kSub * LU);
  SubTokens& tok = *cv.take<SubTokens>(1);
  const int c = blockIdx.x + 1, h = blockIdx.y, g = h / p.hpg;
  const float A = -__expf(bf(p.alog[h])), bias = bf(p.bias[h]);
  float* dS = o.dsend + (int64_t{c - 1} * p.H + h) * PP * NP;
  const int64_t c0 = int64_t{c} * p.chunk, cend = min(c0 + p.chunk, p.T);
  float total = 1.f;
  for (int64_t t0 = c0 + (cend - c0 - 1) / kSub * kSub; t0 >= c0; t0 -= kSub) {
    const bool last = t0 + kSub >= cend;  // the chunk's last sub-chunk: nothing flows in yet
    prepare_tokens(p, h, t0, A, bias, tok);
    __syncthreads();
    load_rows<NP>(Cs, LB, p.C, p.ldc, t0, p.T, g * p.N, p.N, nullptr);
    load_rows<PP>(dYc, LU, o.dy, o.lddy, t0, p.T, h * p.P, p.P, tok.from_s);
    __syncthreads();
    tile_mma<PP, NP, kSub, ColM, RowM>(dYc, LU, Cs, LB, dS, NP, last ? 0.f : tok.carry);
    total *= tok.carry;
    __syncthreads();
  }
  if (threadIdx.x == 0) factors[int64_t{c} * p.H + h] = total;
}

// Step 3: block (chunk, group, slice).
template <int PP, int NP>
__global__ void __launch_bounds__(kThreads) ssd_backward_kernel(SsdParams p, BwdOut o) {
  using L = BwdLayout<PP, NP>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  bf16_t *Cs = cv.take<bf16_t>(kSub * L::LB), *Bs = cv.take<bf16_t>(kSub * L::LB);
  bf16_t *Xs = cv.take<bf16_t>(kSub * L::LU), *dYs = cv.take<bf16_t>(kSub * L::LU);
  bf16_t *S0b = cv.take<bf16_t>(L::s0_bytes() / 2), *dSb = cv.take<bf16_t>(PP * L::LB);
  Carve in_s0{reinterpret_cast<unsigned char*>(S0b)};
  bf16_t *Mb = in_s0.take<bf16_t>(kSub * L::LMB), *dCBb = in_s0.take<bf16_t>(kSub * L::LMB);
  bf16_t* dYc = in_s0.take<bf16_t>(kSub * L::LU);  // dY from_s; u_w = x delta to_e in the recomputation
  float *CBf = cv.take<float>(kSub * L::LM), *Gf = cv.take<float>(kSub * L::LM);
  float* du = cv.take<float>(kSub * L::LY);
  float *dCa = cv.take<float>(kSub * L::LS), *dBa = cv.take<float>(kSub * L::LS);
  SubTokens& tok = *cv.take<SubTokens>(1);
  float* arr = cv.take<float>(6 * kSub + 16);
  float *dcum = arr, *stv = arr + kSub, *da = arr + 2 * kSub, *tddt = arr + 3 * kSub, *tdA = arr + 4 * kSub,
        *tdD = arr + 5 * kSub, *red = arr + 6 * kSub;

  const int c = blockIdx.x, g = blockIdx.y, k = blockIdx.z, P = p.P, N = p.N, GN = p.G * N;
  const int h_begin = g * p.hpg + k * p.hpg / o.slices, h_end = g * p.hpg + (k + 1) * p.hpg / o.slices;
  const int64_t c0 = int64_t{c} * p.chunk, cend = min(c0 + p.chunk, p.T);
  const int subs = static_cast<int>((cend - c0 + kSub - 1) / kSub);
  const int64_t block = (int64_t{c} * p.G + g) * o.slices + k;
  float* scratch = o.scratch + block * (p.chunk / kSub) * PP * NP;
  float* partB = o.part + int64_t{k} * p.T * GN;
  float* partC = o.part + (int64_t{o.slices} + k) * p.T * GN;

  for (int h = h_begin; h < h_end; ++h) {
    const bool first = h == h_begin;
    const float A = -__expf(bf(p.alog[h])), bias = bf(p.bias[h]), Dh = bf(p.D[h]);
    // The sub-chunks' entering states, from the chunk's.
    const float* enter = o.states + (int64_t{c} * p.H + h) * P * N;
    for (int i = threadIdx.x; i < PP * NP; i += kThreads) {
      const int r = i / NP, n = i % NP;
      scratch[i] = r < P && n < N ? enter[r * N + n] : 0.f;
    }
    for (int j = 0; j + 1 < subs; ++j) {
      const int64_t t0 = c0 + int64_t{j} * kSub;
      prepare_tokens(p, h, t0, A, bias, tok);
      load_rows<NP>(Bs, L::LB, p.B, p.ldb, t0, p.T, g * N, N, nullptr);
      load_rows<PP>(Xs, L::LU, p.x, p.ldx, t0, p.T, h * P, P, nullptr);
      __syncthreads();
      for (int i = threadIdx.x; i < kSub * PP; i += kThreads) {  // U_w = x delta to_e
        const int t = i / PP, q = i % PP;
        dYc[t * L::LU + q] = __float2bfloat16(bf(Xs[t * L::LU + q]) * tok.delta[t] * tok.to_e[t]);
      }
      __syncthreads();
      tile_mma<PP, NP, kSub, ColM, RowM>(dYc, L::LU, Bs, L::LB, scratch + (j + 1) * PP * NP, NP, tok.carry,
                                         scratch + j * PP * NP);
      __syncthreads();
    }
    float* dS = o.dsend + (int64_t{c} * p.H + h) * PP * NP;
    float sum_dA = 0.f, sum_dD = 0.f, sum_db = 0.f;
    for (int j = subs - 1; j >= 0; --j) {
      const int64_t t0 = c0 + int64_t{j} * kSub;
      const float* S0 = scratch + j * PP * NP;
      prepare_tokens(p, h, t0, A, bias, tok);
      load_rows<NP>(Cs, L::LB, p.C, p.ldc, t0, p.T, g * N, N, nullptr);
      load_rows<NP>(Bs, L::LB, p.B, p.ldb, t0, p.T, g * N, N, nullptr);
      load_rows<PP>(Xs, L::LU, p.x, p.ldx, t0, p.T, h * P, P, nullptr);
      load_rows<PP>(dYs, L::LU, o.dy, o.lddy, t0, p.T, h * P, P, nullptr);
      float part_dot = 0.f;  // <dS, S0> for the end's d cum
      for (int i = threadIdx.x; i < PP * NP; i += kThreads) {
        const float s0 = S0[i], ds = dS[i];
        S0b[i / NP * L::LB + i % NP] = __float2bfloat16(s0);
        dSb[i / NP * L::LB + i % NP] = __float2bfloat16(ds);
        part_dot += s0 * ds;
      }
      __syncthreads();
      tile_mma<kSub, kSub, NP, RowM, ColM>(Cs, L::LB, Bs, L::LB, CBf, L::LM, 0.f);   // C B^T
      tile_mma<kSub, kSub, PP, RowM, ColM>(dYs, L::LU, Xs, L::LU, Gf, L::LM, 0.f);   // dY X^T
      tile_mma<kSub, NP, PP, RowM, RowM>(dYs, L::LU, S0b, L::LB, dCa, L::LS, 0.f);   // dY S0
      tile_mma<kSub, PP, NP, RowM, ColM>(Bs, L::LB, dSb, L::LB, du, L::LY, 0.f);     // B dS^T
      tile_mma<kSub, NP, PP, RowM, RowM>(Xs, L::LU, dSb, L::LB, dBa, L::LS, 0.f);    // X dS
      __syncthreads();
      for (int i = threadIdx.x; i < kSub * kSub; i += kThreads) {
        const int t = i / kSub, s = i % kSub;
        const float m = sub_decay(tok, t, s), cb = CBf[t * L::LM + s], dcb = Gf[t * L::LM + s] * tok.delta[s] * m;
        Mb[t * L::LMB + s] = __float2bfloat16(cb * m);
        dCBb[t * L::LMB + s] = __float2bfloat16(dcb);
        Gf[t * L::LM + s] = dcb * cb;
      }
      for (int i = threadIdx.x; i < kSub * NP; i += kThreads) {
        const int t = i / NP, n = i % NP;
        dCa[t * L::LS + n] *= tok.from_s[t];
        dBa[t * L::LS + n] *= tok.to_e[t] * tok.delta[t];
      }
      for (int i = threadIdx.x; i < kSub * PP; i += kThreads) du[i / PP * L::LY + i % PP] *= tok.to_e[i / PP];
      const float dot_end = block_sum(part_dot, red);  // (its barriers order the loops above too)
      {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        for (int t = warp; t < kSub; t += kWarps) {
          float v = 0.f, st = 0.f;
          for (int n = lane; n < NP; n += 32) v += dCa[t * L::LS + n] * bf(Cs[t * L::LB + n]);
          for (int q = lane; q < PP; q += 32) st += du[t * L::LY + q] * bf(Xs[t * L::LU + q]);
          st *= tok.delta[t];
          v += Gf[t * L::LM + lane] - Gf[lane * L::LM + t];  // kSub = 32: one (t, s) and (s, t) a lane
#pragma unroll
          for (int o2 = 16; o2 > 0; o2 >>= 1) {
            v += __shfl_xor_sync(0xffffffffu, v, o2);
            st += __shfl_xor_sync(0xffffffffu, st, o2);
          }
          if (lane == 0) dcum[t] = v - st, stv[t] = st;
        }
      }
      __syncthreads();
      tile_mma<kSub, PP, kSub, ColM, RowM>(Mb, L::LMB, dYs, L::LU, du, L::LY, 1.f);     // + Mb^T dY
      tile_mma<kSub, NP, kSub, RowM, RowM>(dCBb, L::LMB, Bs, L::LB, dCa, L::LS, 1.f);   // + dCB B
      tile_mma<kSub, NP, kSub, ColM, RowM>(dCBb, L::LMB, Cs, L::LB, dBa, L::LS, 1.f);   // + dCB^T C
      if (threadIdx.x < 32) {  // d cum's end terms, then d a = reverse cumulative sum (warp 0)
        const int i = threadIdx.x;
        float st = stv[i];
#pragma unroll
        for (int o2 = 16; o2 > 0; o2 >>= 1) st += __shfl_xor_sync(0xffffffffu, st, o2);
        float v = dcum[i] + (i == kSub - 1 ? st + tok.carry * dot_end : 0.f);
#pragma unroll
        for (int o2 = 1; o2 < 32; o2 <<= 1) {
          const float w = __shfl_down_sync(0xffffffffu, v, o2);
          if (i + o2 < 32) v += w;
        }
        da[i] = v;
      }
      __syncthreads();
      // dY scaled by from_s, then dS at the start.
      for (int i = threadIdx.x; i < kSub * PP; i += kThreads) {
        const int t = i / PP, q = i % PP;
        dYc[t * L::LU + q] = __float2bfloat16(bf(dYs[t * L::LU + q]) * tok.from_s[t]);
      }
      __syncthreads();
      tile_mma<PP, NP, kSub, ColM, RowM>(dYc, L::LU, Cs, L::LB, dS, NP, tok.carry);
      {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        for (int t = warp; t < kSub; t += kWarps) {
          const int64_t row = t0 + t;
          float xdu = 0.f, dyx = 0.f;
          if (row < p.T) {
            const float delta = tok.delta[t];
            for (int q = lane; q < P; q += 32) {
              const float xv = bf(Xs[t * L::LU + q]), gy = bf(dYs[t * L::LU + q]);
              const float dv = du[t * L::LY + q];
              xdu += xv * dv;
              dyx += xv * gy;
              o.dx[row * o.lddx + h * P + q] = __float2bfloat16(delta * dv + Dh * gy);
            }
          }
#pragma unroll
          for (int o2 = 16; o2 > 0; o2 >>= 1) {
            xdu += __shfl_xor_sync(0xffffffffu, xdu, o2);
            dyx += __shfl_xor_sync(0xffffffffu, dyx, o2);
          }
          if (lane == 0) {
            const float ddt = (da[t] * A + xdu) * tok.dsig[t];
            if (row < p.T) o.ddt[row * o.ldddt + h] = __float2bfloat16(ddt);
            tddt[t] = row < p.T ? ddt : 0.f;
            tdA[t] = da[t] * tok.delta[t];
            tdD[t] = dyx;
          }
        }
      }
      for (int i = threadIdx.x; i < kSub * N; i += kThreads) {
        const int t = i / N, n = i % N;
        const int64_t row = t0 + t;
        if (row >= p.T) continue;
        const int64_t e = row * GN + g * N + n;
        partB[e] = (first ? 0.f : partB[e]) + dBa[t * L::LS + n];
        partC[e] = (first ? 0.f : partC[e]) + dCa[t * L::LS + n];
      }
      __syncthreads();
      if (threadIdx.x == 0)
        for (int t = 0; t < kSub; ++t) sum_dA += tdA[t], sum_dD += tdD[t], sum_db += tddt[t];
    }
    if (threadIdx.x == 0) {
      float* pg = o.pgrad + (int64_t{c} * p.H + h) * 3;
      pg[0] = sum_dA * A;
      pg[1] = sum_dD;
      pg[2] = sum_db;
    }
    __syncthreads();
  }
}

// Step 4: dB, dC = the slices' partial sums in order (bf16 blocks).
__global__ void ssd_bc_reduce_kernel(const float* __restrict__ part, int slices, int64_t T, int GN,
                                     bf16_t* __restrict__ dB, int64_t lddb, bf16_t* __restrict__ dC, int64_t lddc) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= T * GN) return;
  float b = 0.f, cc = 0.f;
  for (int k = 0; k < slices; ++k) b += part[k * T * GN + e], cc += part[(slices + k) * T * GN + e];
  const int64_t t = e / GN, j = e % GN;
  dB[t * lddb + j] = __float2bfloat16(b);
  dC[t * lddc + j] = __float2bfloat16(cc);
}

// ... and the parameter gradients over the chunks in order (+=).
__global__ void ssd_param_reduce_kernel(const float* __restrict__ pgrad, int chunks, int H, float* __restrict__ dalog,
                                        float* __restrict__ dD, float* __restrict__ dbias) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float a = 0.f, d = 0.f, b = 0.f;
  for (int c = 0; c < chunks; ++c) {
    const float* pg = pgrad + (int64_t{c} * H + h) * 3;
    a += pg[0], d += pg[1], b += pg[2];
  }
  dalog[h] += a;
  dD[h] += d;
  dbias[h] += b;
}

}  // namespace

void ssd_scan_backward(const ops::SsdArgs& a, const ops::ColumnBlock& dy, const Tensor& chunk_states,
                       const ops::SsdGrads& g) {
  const char* op = "ssd_scan_backward";
  check_ssd_cuda(op, a);
  expect_bf16(dy.base, op, "dy");
  expect_bf16(g.dx.base, op, "dx");
  expect_bf16(g.ddt.base, op, "ddt");
  expect_bf16(g.dB.base, op, "dB");
  expect_bf16(g.dC.base, op, "dC");
  ENSURE(chunk_states.dtype == DType::F32, op, ": chunk_states is ", dtype_name(chunk_states.dtype), ", expected f32");
  ENSURE(g.dA_log.dtype == DType::F32 && g.dD.dtype == DType::F32 && g.ddt_bias.dtype == DType::F32, op,
         ": dA_log, dD and ddt_bias must be f32");
  const int64_t T = a.x.rows();
  if (T == 0) return;
  Owned bits = doc_start_bits(a.cu_seqlens, T);
  const SsdParams p = ssd_params(a, static_cast<const uint32_t*>(bits.t.data));
  const int hpg = p.hpg;
  const int slices = static_cast<int>(ops::ssd_backward_slices(p.chunks, p.G, hpg));  // (its workspaces: ops/ssd.h)
  with_dims(p.P, p.N, [&]<int PP, int NP>() {
    const int64_t pad = int64_t{PP} * NP, GN = int64_t{p.G} * p.N;
    Owned dsend = empty({p.chunks * int64_t{p.H} * pad}, DType::F32, Device::CUDA);
    Owned scratch = empty({int64_t{p.chunks} * p.G * slices * (p.chunk / kSub) * pad}, DType::F32, Device::CUDA);
    Owned part = empty({2 * slices * T * GN}, DType::F32, Device::CUDA);
    Owned pgrad = empty({int64_t{p.chunks} * p.H * 3}, DType::F32, Device::CUDA);
    Owned factors = empty({int64_t{p.chunks} * p.H}, DType::F32, Device::CUDA);
    BwdOut o{block_ptr<const bf16_t>(dy), dy.ld(), block_ptr<bf16_t>(g.dx), block_ptr<bf16_t>(g.ddt), g.dx.ld(),
             g.ddt.ld(), static_cast<const float*>(chunk_states.data), static_cast<float*>(dsend.t.data),
             static_cast<float*>(scratch.t.data), static_cast<float*>(part.t.data),
             static_cast<float*>(pgrad.t.data), slices};
    if (p.chunks > 1) {
      const size_t smem1 = carve_bytes(kSub * (NP + kPadB) * 2) + carve_bytes(kSub * (PP + kPadB) * 2) +
                           carve_bytes(sizeof(SubTokens));
      ssd_dstate_kernel<PP, NP><<<dim3(p.chunks - 1, p.H), kThreads, smem1, stream()>>>(
          p, o, static_cast<float*>(factors.t.data));
      check_launch("ssd_dstate_kernel");
    }
    ssd_pass(o.dsend, static_cast<const float*>(factors.t.data), p.chunks, p.H, pad, true);  // step 2
    const size_t smem = BwdLayout<PP, NP>::bytes();
    auto main = ssd_backward_kernel<PP, NP>;
    allow_smem(main, smem);
    main<<<dim3(p.chunks, p.G, slices), kThreads, smem, stream()>>>(p, o);
    check_launch("ssd_backward_kernel");
    ssd_bc_reduce_kernel<<<static_cast<unsigned>(ceil_div(T * GN, 256)), 256, 0, stream()>>>(
        o.part, slices, T, static_cast<int>(GN), block_ptr<bf16_t>(g.dB), g.dB.ld(), block_ptr<bf16_t>(g.dC),
        g.dC.ld());
    check_launch("ssd_bc_reduce_kernel");
    ssd_param_reduce_kernel<<<static_cast<unsigned>(ceil_div(p.H, 128)), 128, 0, stream()>>>(
        o.pgrad, p.chunks, p.H, static_cast<float*>(g.dA_log.data), static_cast<float*>(g.dD.data),
        static_cast<float*>(g.ddt_bias.data));
    check_launch("ssd_param_reduce_kernel");
  });
}

}  // namespace engine::cuda
