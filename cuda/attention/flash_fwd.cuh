// Flash attention forward on mma.sync (FlashAttention-2 style), head dims 64 and 128.
//
// One block per (q tile of kBlockM rows, q head h, sequence s), 4 warps; warp w owns rows
// [32 w, 32 w + 32) of the tile (two m16 tiles). The block walks the visible key tiles of
// kBlockN keys from the last one down, keeping per row the running max m (raw score units),
// the running sum l and the unnormalised output o in registers (online softmax):
//   s_j = q . k_j (masked: -inf);  m' = max(m, max_j s_j);  alpha = 2^((m - m') c)
//   p_j = 2^(s_j c - m' c);  l' = alpha l + sum_j p_j;  o' = alpha o + sum_j p_j v_j
// with c = scale * log2(e). At the end out = o / l and lse = scale m + ln l (natural log).
// S = Q K^T and O += P V run on mma.sync m16n8k16 (bf16 in, f32 accumulate); Q, K, V tiles go
// global -> shared with cp.async and shared -> registers with ldmatrix (.trans for V); P goes
// from the S accumulators straight into A fragments (rounded to bf16) without shared memory.
// Pipelining (one K and one V buffer): the load of V[n] overlaps S = Q K[n]^T and the softmax;
// the load of K[n-1] overlaps O += P V[n]. Key tiles entirely invisible (causal: above the
// diagonal; window: older than m0 - window + 1) are never visited; masks are applied only on
// tiles that cross the diagonal, the window edge or the sequence end. Rows of the last q tile
// past the sequence end are computed on zero-filled Q and never written. With separate keys
// (Lk keys for Lq <= Lk queries, flash_common.cuh Params) the masks and tile ranges use the key
// position of a row, its index + Lk - Lq.
//
// Tiles: D = 128: kBlockM 128, kBlockN 64; D = 64: kBlockM 128, kBlockN 128; 4 warps, two
// blocks per SM. Registers per thread: o 32 D / 8, s 32 kBlockN / 32 (192 for both). Shared:
// (kBlockM + 2 kBlockN) D bf16 = 64 KiB (D = 128) / 48 KiB (D = 64). The output is staged
// through the Q tile for 16-byte stores.
#pragma once
#include "cuda/attention/flash_common.cuh"
#ifndef FLASH_EMULATE
#include "cuda/common/launch.cuh"
#endif

namespace engine::cuda::flash {

template <int kD>
struct FwdConfig {
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kD == 128 ? 64 : 128;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMI = kBlockM / (16 * kWarps);  // m16 tiles per warp
  static constexpr int kRowsPerWarp = 16 * kMI;
  static constexpr int kNI = kBlockN / 8;  // n8 tiles of S per warp (the whole key tile)
  static constexpr int kDI = kD / 8;       // n8 tiles of O per warp (the whole head dim)
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kD * 2;
};

template <int kD>
__global__ void __launch_bounds__(FwdConfig<kD>::kThreads, 2) flash_fwd_kernel(const Params p) {
  using C = FwdConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kMI = C::kMI, kNI = C::kNI,
                kDI = C::kDI, kThreads = C::kThreads;
  FLASH_DYNAMIC_SMEM(smem);
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  const uint32_t sQ_u = smem_u32(sQ);
  const uint32_t sK_u = sQ_u + kBlockM * kD * 2;
  const uint32_t sV_u = sK_u + kBlockN * kD * 2;

  const int seq = blockIdx.z, h = blockIdx.y;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // the longest causal rows start first
  const int seq_begin = p.cu_seqlens_q[seq];
  const int L = p.cu_seqlens_q[seq + 1] - seq_begin;  // queries
  const int m0 = m_block * kBlockM;
  if (m0 >= L) return;
  const int key_begin = p.cu_seqlens_k[seq];
  const int Lk = p.cu_seqlens_k[seq + 1] - key_begin;  // keys, >= L
  const int pos0 = m0 + (Lk - L);                      // key position of the tile's row 0

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.num_heads, kv = h / (H / p.num_kv_heads);
  const int64_t row = p.q_row, krow = p.kv_row;
  const bf16* q_g = p.q + (seq_begin + static_cast<int64_t>(m0)) * row + h * kD;
  const bf16* k_g = p.k + static_cast<int64_t>(key_begin) * krow + kv * kD;
  const bf16* v_g = k_g + p.num_kv_heads * kD;

  // Visible key range of the tile: [key_lo, key_hi).
  const int key_lo = p.window > 0 ? max(0, pos0 - p.window + 1) : 0;
  const int key_hi = p.causal ? min(Lk, pos0 + kBlockM) : Lk;
  const int n_first = key_lo / kBlockN;
  const int n_last = (key_hi - 1) / kBlockN;

  load_tile_async<kBlockM, kD, kThreads>(sQ_u, q_g, row, L - m0, tid);
  load_tile_async<kBlockN, kD, kThreads>(sK_u, k_g + n_last * kBlockN * krow, krow,
                                         Lk - n_last * kBlockN, tid);
  cp_async_commit();

  float acc_o[kMI][kDI][4];
  zero(acc_o);
  float m_run[kMI][2], l_run[kMI][2];
  FLASH_UNROLL
  for (int mi = 0; mi < kMI; ++mi)
    FLASH_UNROLL
    for (int hf = 0; hf < 2; ++hf) m_run[mi][hf] = -INFINITY, l_run[mi][hf] = 0.f;

  const int warp_row0 = warp * C::kRowsPerWarp;  // first tile row of this warp
  const float c = p.scale * kLog2e;  // as the host computed scale_log2 before: same product

  for (int n = n_last; n >= n_first; --n) {
    const int n0 = n * kBlockN;
    cp_async_wait_all();
    __syncthreads();  // K[n] (and Q) in place; every warp is done reading V[n+1]
    load_tile_async<kBlockN, kD, kThreads>(sV_u, v_g + n0 * krow, krow, Lk - n0, tid);
    cp_async_commit();

    float acc_s[kMI][kNI][4];
    zero(acc_s);
    warp_gemm<kMI, kNI, kD, Operand::kA, kD, Operand::kB, kD>(acc_s, sQ_u, warp_row0, sK_u, 0,
                                                               lane);

    const bool need_mask = n0 + kBlockN > Lk || (p.causal && n0 + kBlockN - 1 > pos0) ||
                           (p.window > 0 && pos0 + kBlockM - 1 - n0 >= p.window);
    if (need_mask) {
      // The row at key position i sees tile columns [lo, hi) (relative to n0).
      FLASH_UNROLL
      for (int mi = 0; mi < kMI; ++mi)
        FLASH_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int i = pos0 + warp_row0 + mi * 16 + frag_row(lane, 2 * hf);
          const int hi = (p.causal ? min(i + 1, Lk) : Lk) - n0;
          const int lo = (p.window > 0 ? i - p.window + 1 : 0) - n0;
          FLASH_UNROLL
          for (int ni = 0; ni < kNI; ++ni)
            FLASH_UNROLL
            for (int x = 0; x < 2; ++x) {
              const int j = ni * 8 + frag_col(lane, x);
              if (j >= hi || j < lo) acc_s[mi][ni][2 * hf + x] = -INFINITY;
            }
        }
    }

    // Online softmax; a row's values live in the 4 lanes of a quad (same lane / 4).
    FLASH_UNROLL
    for (int mi = 0; mi < kMI; ++mi)
      FLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        float mx = m_run[mi][hf];
        FLASH_UNROLL
        for (int ni = 0; ni < kNI; ++ni)
          mx = fmaxf(mx, fmaxf(acc_s[mi][ni][2 * hf], acc_s[mi][ni][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with nothing visible yet keeps m = -inf; exponents then use 0 (p = 0, alpha = 0).
        const float m_scaled = mx == -INFINITY ? 0.f : mx * c;
        const float alpha = ex2(m_run[mi][hf] * c - m_scaled);
        m_run[mi][hf] = mx;
        float sum = 0.f;
        FLASH_UNROLL
        for (int ni = 0; ni < kNI; ++ni)
          FLASH_UNROLL
          for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
            const float pe = ex2(fmaf(acc_s[mi][ni][e], c, -m_scaled));
            acc_s[mi][ni][e] = pe;
            sum += pe;
          }
        l_run[mi][hf] = l_run[mi][hf] * alpha + sum;
        FLASH_UNROLL
        for (int di = 0; di < kDI; ++di) {
          acc_o[mi][di][2 * hf] *= alpha;
          acc_o[mi][di][2 * hf + 1] *= alpha;
        }
      }

    cp_async_wait_all();
    __syncthreads();  // V[n] in place; every warp is done reading K[n]
    if (n > n_first) {
      load_tile_async<kBlockN, kD, kThreads>(sK_u, k_g + (n0 - kBlockN) * krow, krow,
                                             Lk - (n0 - kBlockN), tid);
      cp_async_commit();
    }

    // O += P V: P from registers (the S accumulators of keys 16 kk .. 16 kk + 15 form the A
    // fragment), V as B with ldmatrix.trans.
    const uint32_t v_off = lane_offset<Operand::kBTrans, kD>(0, lane);
    FLASH_UNROLL
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMI][4];
      FLASH_UNROLL
      for (int mi = 0; mi < kMI; ++mi) {
        a[mi][0] = pack_bf16(acc_s[mi][2 * kk][0], acc_s[mi][2 * kk][1]);
        a[mi][1] = pack_bf16(acc_s[mi][2 * kk][2], acc_s[mi][2 * kk][3]);
        a[mi][2] = pack_bf16(acc_s[mi][2 * kk + 1][0], acc_s[mi][2 * kk + 1][1]);
        a[mi][3] = pack_bf16(acc_s[mi][2 * kk + 1][2], acc_s[mi][2 * kk + 1][3]);
      }
      FLASH_UNROLL
      for (int nj = 0; nj < kDI / 2; ++nj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sV_u + operand_offset<Operand::kBTrans, kD>(v_off, nj, kk));
        FLASH_UNROLL
        for (int mi = 0; mi < kMI; ++mi) {
          mma_bf16(acc_o[mi][2 * nj], a[mi], b[0], b[1]);
          mma_bf16(acc_o[mi][2 * nj + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }

  // Normalise, write lse, stage O (bf16) in this warp's own rows of the Q tile (only this warp
  // ever read them), then store whole 16-byte chunks of the rows inside the sequence.
  __syncwarp();
  FLASH_UNROLL
  for (int mi = 0; mi < kMI; ++mi)
    FLASH_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[mi][hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int r = warp_row0 + mi * 16 + frag_row(lane, 2 * hf);
      const int i = m0 + r;
      if ((lane & 3) == 0 && i < L)
        p.lse[(seq_begin + static_cast<int64_t>(i)) * H + h] =
            m_run[mi][hf] * p.scale + logf(l);
      FLASH_UNROLL
      for (int di = 0; di < kDI; ++di) {
        const uint32_t v = pack_bf16(acc_o[mi][di][2 * hf] * inv, acc_o[mi][di][2 * hf + 1] * inv);
        const int col = di * 8 + frag_col(lane, 2 * hf);
        *reinterpret_cast<uint32_t*>(smem + swizzle_elem<kD>(r, col)) = v;
      }
    }
  __syncwarp();
  constexpr int kChunks = kD / 8;
  FLASH_UNROLL
  for (int it = 0; it < C::kRowsPerWarp * kChunks / 32; ++it) {
    const int idx = lane + 32 * it;
    const int r = warp_row0 + idx / kChunks, ch = idx % kChunks, i = m0 + r;
    if (i < L) {
      bf16* dst = p.out + ((seq_begin + static_cast<int64_t>(i)) * H + h) * kD + ch * 8;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(smem + swizzle<kD>(r, ch));
    }
  }
}

#ifndef FLASH_EMULATE
template <int kD>
void run_flash_fwd(const Params& p, const Grid& g, cudaStream_t stream) {
  using C = FwdConfig<kD>;
  auto kernel = flash_fwd_kernel<kD>;
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    C::kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(ceil_div(g.max_seqlen_q, C::kBlockM)),
                  static_cast<unsigned>(p.num_heads), static_cast<unsigned>(g.num_seqs));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  check_launch("flash_fwd_kernel");
}

#endif  // FLASH_EMULATE

}  // namespace engine::cuda::flash
