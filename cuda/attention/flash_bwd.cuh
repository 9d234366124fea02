// Flash attention backward on mma.sync (FlashAttention-2 algorithm), head dims 64 and 128.
//
// Before this kernel: dsum_i = rowsum(dout_i * out_i) (f32) and dq_accum = 0 (flash.cu).
// One block per (key tile of kBlockN keys, kv head, sequence), 8 warps. The block keeps its K
// and V tiles in shared memory and dK, dV of the tile in registers, and loops over the q heads
// of its kv group and, per head, over the q tiles of kBlockM rows that see any of its keys
// (causal: from the tile's first key on; window: up to its last key + window - 1). Per q tile,
// with P recomputed from the saved lse (natural log, turned into base 2):
//   S = Q K^T,  P = 2^(S c - lse log2 e) (0 where masked),  dP = dO V^T
//   dS = P * (dP - dsum)               (per row; rounded to bf16 like P)
//   dV += P^T dO,  dK += dS^T Q,       (registers, summed over the group's q heads: GQA)
//   dQ += dS K                         (f32 atomics into dq_accum; scale applied when dq_accum
//                                       is converted to bf16, dK gets its scale at the end)
// with c = scale * log2(e). dQ is therefore not bitwise deterministic (the order of the f32
// atomic adds of the key tiles varies); dK and dV are.
// Warp layouts (w = warp 0..7): S and dP are 2 x 4 warps of 32 x 32; dV, dK 4 x 2 warps of
// 32 keys x D/2; dQ 2 x 4 warps of 32 rows x D/4. P and dS go to shared memory (bf16) between
// the two halves, as they are re-read transposed (dV, dK: ldmatrix.trans) and by other warps.
// Q, dO, lse and dsum of the next q tile are loaded (cp.async) into the second of two buffers
// while the current tile is computed. Rows and keys past the sequence end are zero-filled,
// masked to P = 0, and never written (dQ atomics skip them).
//
// Tiles: kBlockM 64 q rows, kBlockN 128 keys, 256 threads, one block per SM (registers:
// dK, dV accumulators 64 + 64 at D = 128). Shared: K, V 2 kBlockN D, Q, dO 2 x 2 kBlockM D,
// P, dS 2 kBlockM kBlockN bf16, lse and dsum 2 x 2 kBlockM f32: 161 KiB (D = 128), 97 KiB
// (D = 64).
#pragma once
#include "cuda/attention/flash_common.cuh"
#ifndef FLASH_EMULATE
#include "cuda/common/launch.cuh"
#endif

namespace engine::cuda::flash {

template <int kD>
struct BwdConfig {
  static constexpr int kBlockM = 64;   // q rows per tile
  static constexpr int kBlockN = 128;  // keys per block
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // Byte offsets in shared memory.
  static constexpr int kKVBytes = kBlockN * kD * 2;
  static constexpr int kQBytes = kBlockM * kD * 2;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVBytes;
  static constexpr int kOffQ = kOffV + kKVBytes;     // 2 buffers
  static constexpr int kOffdO = kOffQ + 2 * kQBytes;  // 2 buffers
  static constexpr int kOffP = kOffdO + 2 * kQBytes;
  static constexpr int kOffdS = kOffP + kPBytes;
  static constexpr int kOffLse = kOffdS + kPBytes;           // 2 x kBlockM f32
  static constexpr int kOffDsum = kOffLse + 2 * kBlockM * 4;  // 2 x kBlockM f32
  static constexpr int kSmemBytes = kOffDsum + 2 * kBlockM * 4;
};

template <int kD>
__global__ void __launch_bounds__(BwdConfig<kD>::kThreads, 1) flash_bwd_kernel(const Params p) {
  using C = BwdConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kThreads = C::kThreads;
  constexpr int kNIdkv = kD / 16;  // n8 tiles of dK, dV per warp (D / 2 columns)
  constexpr int kNIdq = kD / 32;   // n8 tiles of dQ per warp (D / 4 columns)
  FLASH_DYNAMIC_SMEM(smem);
  const uint32_t s_u = smem_u32(smem);
  const uint32_t sK = s_u + C::kOffK, sV = s_u + C::kOffV, sQ0 = s_u + C::kOffQ,
                 sdO0 = s_u + C::kOffdO, sP = s_u + C::kOffP, sdS = s_u + C::kOffdS;
  const float* sLse = reinterpret_cast<const float*>(smem + C::kOffLse);
  const float* sDsum = reinterpret_cast<const float*>(smem + C::kOffDsum);

  const int seq = blockIdx.z, kv = blockIdx.y, n0 = blockIdx.x * kBlockN;
  const int seq_begin = p.cu_seqlens[seq];
  const int L = p.cu_seqlens[seq + 1] - seq_begin;
  if (n0 >= L) return;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.num_heads, Hkv = p.num_kv_heads, G = H / Hkv;
  const int64_t row = p.qkv_row, tok0 = seq_begin;
  const bf16* k_g = p.qkv + (tok0 + n0) * row + (H + kv) * kD;
  const bf16* v_g = k_g + Hkv * kD;

  // q rows that see any key of the tile: [i_lo, i_hi).
  const int i_lo = p.causal ? n0 : 0;
  const int i_hi = p.window > 0 ? min(L, n0 + kBlockN - 1 + p.window) : L;
  const int m_first = i_lo / kBlockM;
  const int m_count = (i_hi + kBlockM - 1) / kBlockM - m_first;
  const int n_iter = G * m_count;  // (q head, q tile) pairs, q tiles inner

  auto load_q_tile = [&](int it, int buf) {
    const int h = kv * G + it / m_count, m0 = (m_first + it % m_count) * kBlockM;
    const int64_t tok = tok0 + m0;
    load_tile_async<kBlockM, kD, kThreads>(sQ0 + buf * C::kQBytes, p.qkv + tok * row + h * kD,
                                           row, L - m0, tid);
    load_tile_async<kBlockM, kD, kThreads>(sdO0 + buf * C::kQBytes,
                                           p.dout + (tok * H + h) * kD, int64_t{H} * kD, L - m0,
                                           tid);
    if (tid < 2 * kBlockM) {
      const int r = tid % kBlockM;
      const bool valid = m0 + r < L;
      const float* src = (tid < kBlockM ? p.lse : p.dsum) + (tok + (valid ? r : 0)) * H + h;
      const int off = (tid < kBlockM ? C::kOffLse : C::kOffDsum) + (buf * kBlockM + r) * 4;
      cp_async_4(s_u + off, src, valid);
    }
  };

  load_tile_async<kBlockN, kD, kThreads>(sK, k_g, row, L - n0, tid);
  load_tile_async<kBlockN, kD, kThreads>(sV, v_g, row, L - n0, tid);
  if (n_iter > 0) load_q_tile(0, 0);
  cp_async_commit();

  float acc_dk[2][kNIdkv][4], acc_dv[2][kNIdkv][4];
  zero(acc_dk);
  zero(acc_dv);
  const int wm = warp >> 2, wn = warp & 3;  // S, dP and dQ: 2 x 4 warps
  const int wk = warp >> 1, wd = warp & 1;  // dK, dV: 4 x 2 warps
  const float c = p.scale_log2;

  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    const int h = kv * G + it / m_count, m0 = (m_first + it % m_count) * kBlockM;
    const uint32_t sQ = sQ0 + buf * C::kQBytes, sdO = sdO0 + buf * C::kQBytes;
    cp_async_wait_all();
    __syncthreads();  // tile `it` in place; every warp is done with iteration it - 1
    if (it + 1 < n_iter) {
      load_q_tile(it + 1, buf ^ 1);
      cp_async_commit();
    }

    float acc_s[2][4][4], acc_dp[2][4][4];
    zero(acc_s);
    zero(acc_dp);
    warp_gemm<2, 4, kD, Operand::kA, kD, Operand::kB, kD>(acc_s, sQ, wm * 32, sK, wn * 32, lane);
    warp_gemm<2, 4, kD, Operand::kA, kD, Operand::kB, kD>(acc_dp, sdO, wm * 32, sV, wn * 32,
                                                          lane);

    const bool need_mask = m0 + kBlockM > L || n0 + kBlockN > L ||
                           (p.causal && n0 + kBlockN - 1 > m0) ||
                           (p.window > 0 && m0 + kBlockM - 1 - n0 >= p.window);
    FLASH_UNROLL
    for (int mi = 0; mi < 2; ++mi)
      FLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        const int r = wm * 32 + mi * 16 + frag_row(lane, 2 * hf), i = m0 + r;
        const float lse2 = sLse[buf * kBlockM + r] * kLog2e;
        const float dsum = sDsum[buf * kBlockM + r];
        // Row i sees the warp's columns [lo, hi) (relative to n0 + 32 wn); none past the end.
        const int col0 = n0 + wn * 32;
        const int hi = i >= L ? -1 : (p.causal ? min(i + 1, L) : L) - col0;
        const int lo = (p.window > 0 ? i - p.window + 1 : 0) - col0;
        FLASH_UNROLL
        for (int ni = 0; ni < 4; ++ni) {
          float pe[2], ds[2];
          FLASH_UNROLL
          for (int x = 0; x < 2; ++x) {
            const int e = 2 * hf + x, j = ni * 8 + frag_col(lane, e);
            pe[x] = fast_exp2(fmaf(acc_s[mi][ni][e], c, -lse2));
            if (need_mask && (j >= hi || j < lo)) pe[x] = 0.f;
            ds[x] = pe[x] * (acc_dp[mi][ni][e] - dsum);
          }
          const uint32_t off = swizzle_elem<kBlockN>(r, wn * 32 + ni * 8 + frag_col(lane, 0));
          *reinterpret_cast<uint32_t*>(smem + C::kOffP + off) = pack_bf16(pe[0], pe[1]);
          *reinterpret_cast<uint32_t*>(smem + C::kOffdS + off) = pack_bf16(ds[0], ds[1]);
        }
      }
    __syncthreads();  // P and dS complete

    // dQ (this tile's part) = dS K, added into dq_accum.
    {
      float acc_dq[2][kNIdq][4];
      zero(acc_dq);
      warp_gemm<2, kNIdq, kBlockN, Operand::kA, kBlockN, Operand::kBTrans, kD>(
          acc_dq, sdS, wm * 32, sK, wn * (kD / 4), lane);
      FLASH_UNROLL
      for (int mi = 0; mi < 2; ++mi)
        FLASH_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int i = m0 + wm * 32 + mi * 16 + frag_row(lane, 2 * hf);
          if (i >= L) continue;
          float* dq_row = p.dq_accum + ((tok0 + i) * H + h) * kD + wn * (kD / 4);
          FLASH_UNROLL
          for (int ni = 0; ni < kNIdq; ++ni) {
            float2* dst = reinterpret_cast<float2*>(dq_row + ni * 8 + frag_col(lane, 0));
            const float2 v = make_float2(acc_dq[mi][ni][2 * hf], acc_dq[mi][ni][2 * hf + 1]);
#if __CUDA_ARCH__ >= 900
            atomicAdd(dst, v);
#else
            atomicAdd(&dst->x, v.x);
            atomicAdd(&dst->y, v.y);
#endif
          }
        }
    }

    warp_gemm<2, kNIdkv, kBlockM, Operand::kATrans, kBlockN, Operand::kBTrans, kD>(
        acc_dv, sP, wk * 32, sdO, wd * (kD / 2), lane);
    warp_gemm<2, kNIdkv, kBlockM, Operand::kATrans, kBlockN, Operand::kBTrans, kD>(
        acc_dk, sdS, wk * 32, sQ, wd * (kD / 2), lane);
  }
  cp_async_wait_all();

  // dK = scale dS^T Q, dV: bf16 pairs straight from the accumulators.
  FLASH_UNROLL
  for (int mi = 0; mi < 2; ++mi)
    FLASH_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const int j = n0 + wk * 32 + mi * 16 + frag_row(lane, 2 * hf);
      if (j >= L) continue;
      bf16* dk_row = p.dqkv + (tok0 + j) * row + (H + kv) * kD + wd * (kD / 2);
      bf16* dv_row = dk_row + Hkv * kD;
      FLASH_UNROLL
      for (int ni = 0; ni < kNIdkv; ++ni) {
        const int col = ni * 8 + frag_col(lane, 0);
        *reinterpret_cast<uint32_t*>(dk_row + col) =
            pack_bf16(acc_dk[mi][ni][2 * hf] * p.scale, acc_dk[mi][ni][2 * hf + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_row + col) =
            pack_bf16(acc_dv[mi][ni][2 * hf], acc_dv[mi][ni][2 * hf + 1]);
      }
    }
}

#ifndef FLASH_EMULATE
template <int kD>
void run_flash_bwd(const Params& p, cudaStream_t stream) {
  using C = BwdConfig<kD>;
  auto kernel = flash_bwd_kernel<kD>;
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    C::kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.max_seqlen, C::kBlockN)),
                  static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.num_seqs));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  check_launch("flash_bwd_kernel");
}

#endif  // FLASH_EMULATE

}  // namespace engine::cuda::flash
