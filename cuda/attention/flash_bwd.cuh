// Flash attention backward on mma.sync (FlashAttention-2 algorithm), head dims 64 and 128.
//
// Before this kernel (flash.cu): dsum_i = rowsum(dout_i * out_i) (f32) and dq_accum = 0.
// One block per (key tile of kBlockN keys, kv head, sequence), 8 warps. The block keeps its K
// and V tiles in shared memory and dK, dV of the tile in registers, and loops over the q heads
// of its kv group and, per head, over the q tiles of kBlockM rows that see any of its keys
// (causal: from the tile's first key on; window: up to its last key + window - 1; with separate
// keys, Lk >= Lq, in query positions: a key's position minus Lk - Lq). Blocks whose keys no
// query sees (a sequence without queries, keys older than every window) write dK = dV = 0.
// Per q tile, with P recomputed from the saved lse (natural log, turned into base 2):
//   S = Q K^T,  P = 2^(S c - lse log2 e) (0 where masked),  dP = dO V^T
//   dS = P * (dP - dsum)               (per row; rounded to bf16 like P)
//   dV += P^T dO,  dK += dS^T Q,       (registers, summed over the group's q heads: GQA)
//   dQ += dS K                         (added into the f32 dq_accum; scale applied when
//                                       dq_accum is converted to bf16, dK gets it at the end)
// with c = scale * log2(e). dQ is not bitwise deterministic (the order in which the key tiles
// add into dq_accum varies); dK and dV are.
// Warp layouts (w = warp 0..7): S and dP are 2 x 4 warps of 32 x 32; dV, dK 4 x 2 warps of
// 32 keys x D/2; dQ 2 x 4 warps of 32 rows x D/4. P and dS go to shared memory (bf16) between
// the two halves, as they are re-read transposed (dV, dK: ldmatrix.trans) and by other warps.
// P is computed right after S = Q K^T and stored before dP = dO V^T (its exponentials can
// overlap that GEMM); the masked and unmasked variants of this part are separate code paths.
// dQ of a tile goes from the accumulators into a shared f32 staging tile in dq_accum's own
// layout (flash_layout.h: head-major, chunks swizzled by token, so these stores are free of
// bank conflicts); after the next barrier (B1 of the next iteration) one thread adds the
// whole tile (its rows inside the sequence: contiguous in dq_accum) with one bulk reduction
// (cp.reduce.async.bulk .add.f32, the copy engine) instead of per-thread f32 atomics, and
// waits for the engine to have read the staging tile before B2, after which it is written
// again. (Before sm_90: f32 atomics from the staging tile, with the same barriers.)
// Q, dO, lse and dsum of the next q tile are loaded (cp.async) into the second of two buffers
// while the current tile is computed. Rows and keys past the sequence end are zero-filled,
// masked to P = 0, and never written (the dQ reduction covers the rows inside only).
// Barriers per q tile: B1 (top; the tile's Q, dO in place, every warp done with the previous
// tile, its dQ staging tile complete), B2 (P and dS complete, the staging tile read out).
// Launch order: blocks are handed out in sections of a few (kv head, sequence) pairs, the
// longest causal key tiles of a section first (bwd_block in flash_layout.h; the launcher sizes
// a section so that its q, dO and dQ rows fit in about 24 MB of L2).
//
// Tiles: kBlockM 64 q rows, kBlockN 128 keys, 256 threads, one block per SM (registers:
// dK, dV accumulators 64 + 64 at D = 128). Shared: K, V 2 kBlockN D, Q, dO 2 x 2 kBlockM D,
// P, dS 2 kBlockM kBlockN bf16, lse and dsum 2 x 2 kBlockM f32, dQ staging kBlockM D f32:
// 193 KiB (D = 128), 113 KiB (D = 64).
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
  static constexpr int kOffdQ = kOffDsum + 2 * kBlockM * 4;  // kBlockM x kD f32, dq layout
  static constexpr int kSmemBytes = kOffdQ + kBlockM * kD * 4;
  static_assert(kOffdQ % 16 == 0, "the bulk reduction reads 16-byte aligned shared memory");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than a block of sm_90 may have");
};

// Whether dQ tiles are added with the copy engine's bulk reduction (sm_90) or f32 atomics.
#if defined(FLASH_EMULATE) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define FLASH_BULK_DQ 1
#else
#define FLASH_BULK_DQ 0
#endif

template <int kD>
__global__ void __launch_bounds__(BwdConfig<kD>::kThreads, 1) flash_bwd_kernel(const Params p) {
  using C = BwdConfig<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kThreads = C::kThreads;
  constexpr int kNIdkv = kD / 16;  // n8 tiles of dK, dV per warp (D / 2 columns)
  constexpr int kNIdq = kD / 32;   // n8 tiles of dQ per warp (D / 4 columns)
  FLASH_DYNAMIC_SMEM(smem);
  const uint32_t s_u = smem_u32(smem);
  const uint32_t sK = s_u + C::kOffK, sV = s_u + C::kOffV, sQ0 = s_u + C::kOffQ,
                 sdO0 = s_u + C::kOffdO, sP = s_u + C::kOffP, sdS = s_u + C::kOffdS,
                 sdQ = s_u + C::kOffdQ;
  const float* sLse = reinterpret_cast<const float*>(smem + C::kOffLse);
  const float* sDsum = reinterpret_cast<const float*>(smem + C::kOffDsum);

  const int H = p.num_heads, Hkv = p.num_kv_heads, G = H / Hkv;
  const int64_t linear =
      blockIdx.x + int64_t{gridDim.x} * (blockIdx.y + int64_t{gridDim.y} * blockIdx.z);
  const BwdBlock blk = bwd_block(linear, static_cast<int>(gridDim.x),
                                 int64_t{Hkv} * gridDim.z, p.bwd_section);
  const int seq = static_cast<int>(blk.pair / Hkv), kv = static_cast<int>(blk.pair % Hkv);
  const int key_begin = p.cu_seqlens_k[seq];
  const int Lk = p.cu_seqlens_k[seq + 1] - key_begin;  // keys
  if (blk.n_block * kBlockN >= Lk) return;
  const int seq_begin = p.cu_seqlens_q[seq];
  const int L = p.cu_seqlens_q[seq + 1] - seq_begin;  // queries, <= Lk
  // Query i sits at key position i + Lk - L. Below, keys are counted in query positions: the
  // tile's first key is n0 (< 0 when it is older than the first query); key n0 + c is visible
  // to row i iff (!causal || n0 + c <= i) && (window == 0 || i - (n0 + c) < window), and the
  // keys end at L.
  const int n0 = blk.n_block * kBlockN - (Lk - L);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row = p.q_row, krow = p.kv_row, tok0 = seq_begin;
  // The tile's key row 0 in k, v, dk and dv.
  const int64_t k_offset = (int64_t{key_begin} + blk.n_block * kBlockN) * krow + kv * kD;

  // q rows that see any key of the tile: [i_lo, i_hi), none when i_hi <= i_lo (the tile's keys
  // are all older than the window of the first query, or the sequence has no queries): the
  // loop then does not run and dK = dV = 0 is written.
  const int i_lo = p.causal ? max(0, n0) : 0;
  const int i_hi = p.window > 0 ? min(L, n0 + kBlockN - 1 + p.window) : L;
  const int m_begin = i_lo / kBlockM * kBlockM;
  const int m_end = i_hi > i_lo ? (i_hi + kBlockM - 1) / kBlockM * kBlockM : m_begin;
  const int n_iter = G * ((m_end - m_begin) / kBlockM);  // (q head, q tile) pairs, tiles inner
  // The next (q head, first row) pair after (h, m0).
  auto advance = [&](int& h, int& m0) {
    m0 += kBlockM;
    if (m0 == m_end) m0 = m_begin, ++h;
  };

  auto load_q_tile = [&](int h, int m0, int buf) {
    const int tx = thread_x();  // = tid; what derives from it is recomputed per tile (registers)
    const int64_t tok = tok0 + m0;
    load_tile_async<kBlockM, kD, kThreads>(sQ0 + buf * C::kQBytes, p.q + tok * row + h * kD,
                                           row, L - m0, tx);
    load_tile_async<kBlockM, kD, kThreads>(sdO0 + buf * C::kQBytes,
                                           p.dout + (tok * H + h) * kD, int64_t{H} * kD, L - m0,
                                           tx);
    if (tx < 2 * kBlockM) {
      const int r = tx % kBlockM;
      const bool valid = m0 + r < L;
      const float* src = (tx < kBlockM ? p.lse : p.dsum) + (tok + (valid ? r : 0)) * H + h;
      const int off = (tx < kBlockM ? C::kOffLse : C::kOffDsum) + (buf * kBlockM + r) * 4;
      cp_async_4(s_u + off, src, valid);
    }
  };

  // Adds the staged dQ tile of (h, m0) into dq_accum: its rows inside the sequence, which are
  // contiguous there. Called by all threads after a barrier that follows the staging stores.
  auto flush_dq = [&](int h, int m0) {
    const int rows = min(kBlockM, L - m0);
    float* dst = p.dq_accum + (int64_t{h} * p.num_tokens + tok0 + m0) * kD;
#if FLASH_BULK_DQ
    if (tid == 0) {
      bulk_reduce_add_f32(dst, sdQ, static_cast<uint32_t>(rows * kD * 4));
      bulk_commit();
    }
#else
    for (int i = tid; i < rows * (kD / 4); i += kThreads) {
      const float4 v = *reinterpret_cast<const float4*>(smem + C::kOffdQ + 16 * i);
      atomicAdd(dst + 4 * i, v.x);
      atomicAdd(dst + 4 * i + 1, v.y);
      atomicAdd(dst + 4 * i + 2, v.z);
      atomicAdd(dst + 4 * i + 3, v.w);
    }
#endif
  };

  // (q head, first row) of the tile of this iteration; until the flush at its top, of the last.
  int h = kv * G, m0 = m_begin;
  load_tile_async<kBlockN, kD, kThreads>(sK, p.k + k_offset, krow, L - n0, tid);
  load_tile_async<kBlockN, kD, kThreads>(sV, p.k + k_offset + Hkv * kD, krow, L - n0, tid);
  if (n_iter > 0) load_q_tile(h, m0, 0);
  cp_async_commit();

  float acc_dk[2][kNIdkv][4], acc_dv[2][kNIdkv][4];
  zero(acc_dk);
  zero(acc_dv);
  const int wm = warp >> 2, wn = warp & 3;  // S, dP and dQ: 2 x 4 warps
  const int wk = warp >> 1, wd = warp & 1;  // dK, dV: 4 x 2 warps
  const float c = p.scale * kLog2e;

  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    const uint32_t sQ = sQ0 + buf * C::kQBytes, sdO = sdO0 + buf * C::kQBytes;
    cp_async_wait_all();
    __syncthreads();  // B1: tile `it` in place; every warp is done with iteration it - 1
    if (it > 0) {
      flush_dq(h, m0);  // the dQ of iteration it - 1
      advance(h, m0);
    }
    if (it + 1 < n_iter) {  // the next tile, into the other buffers (free since B1)
      int next_h = h, next_m0 = m0;
      advance(next_h, next_m0);
      load_q_tile(next_h, next_m0, buf ^ 1);
      cp_async_commit();
    }

    // S, P (stored, and kept in f32 for dS), dP, dS (stored). Masks only where the tile
    // crosses the diagonal, the window edge or the sequence end.
    auto scores = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      float acc_s[2][4][4];
      zero(acc_s);
      warp_gemm<2, 4, kD, Operand::kA, kD, Operand::kB, kD>(acc_s, sQ, wm * 32, sK, wn * 32,
                                                            lane);
      FLASH_UNROLL
      for (int mi = 0; mi < 2; ++mi)
        FLASH_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int r = wm * 32 + mi * 16 + frag_row(lane, 2 * hf), i = m0 + r;
          const float lse2 = sLse[buf * kBlockM + r] * kLog2e;
          // Row i sees the warp's columns [lo, hi) (relative to n0 + 32 wn); none past the end.
          const int col0 = n0 + wn * 32;
          [[maybe_unused]] const int hi = i >= L ? -1 : (p.causal ? min(i + 1, L) : L) - col0;
          // (Without a window every key from the tile's first, n0, on.)
          [[maybe_unused]] const int lo = (p.window > 0 ? i - p.window + 1 : n0) - col0;
          FLASH_UNROLL
          for (int ni = 0; ni < 4; ++ni) {
            FLASH_UNROLL
            for (int x = 0; x < 2; ++x) {
              const int e = 2 * hf + x;
              float pe = ex2(fmaf(acc_s[mi][ni][e], c, -lse2));
              if constexpr (kMasked) {
                const int j = ni * 8 + frag_col(lane, e);
                if (j >= hi || j < lo) pe = 0.f;
              }
              acc_s[mi][ni][e] = pe;
            }
            const uint32_t off = swizzle_elem<kBlockN>(r, wn * 32 + ni * 8 + frag_col(lane, 0));
            *reinterpret_cast<uint32_t*>(smem + C::kOffP + off) =
                pack_bf16(acc_s[mi][ni][2 * hf], acc_s[mi][ni][2 * hf + 1]);
          }
        }

      float acc_dp[2][4][4];
      zero(acc_dp);
      warp_gemm<2, 4, kD, Operand::kA, kD, Operand::kB, kD>(acc_dp, sdO, wm * 32, sV, wn * 32,
                                                            lane);
      FLASH_UNROLL
      for (int mi = 0; mi < 2; ++mi)
        FLASH_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int r = wm * 32 + mi * 16 + frag_row(lane, 2 * hf);
          const float dsum = sDsum[buf * kBlockM + r];
          FLASH_UNROLL
          for (int ni = 0; ni < 4; ++ni) {
            const int e = 2 * hf;
            const uint32_t off = swizzle_elem<kBlockN>(r, wn * 32 + ni * 8 + frag_col(lane, 0));
            *reinterpret_cast<uint32_t*>(smem + C::kOffdS + off) =
                pack_bf16(acc_s[mi][ni][e] * (acc_dp[mi][ni][e] - dsum),
                          acc_s[mi][ni][e + 1] * (acc_dp[mi][ni][e + 1] - dsum));
          }
        }
    };
    const bool need_mask = m0 + kBlockM > L || n0 + kBlockN > L ||
                           (p.causal && n0 + kBlockN - 1 > m0) ||
                           (p.window > 0 && m0 + kBlockM - 1 - n0 >= p.window);
    if (need_mask)
      scores(std::true_type{});
    else
      scores(std::false_type{});
#if FLASH_BULK_DQ
    // The reduction issued after B1 has read the staging tile. (This wait is on the same
    // scoreboard as cp.async.wait_group in SASS: it also waits for thread 0's loads of the
    // next tile, issued after B1 too, which have had all of S, P, dP and dS to land.)
    if (tid == 0) bulk_wait_read();
#endif
    __syncthreads();  // B2: P and dS complete; the staging tile free

    // dQ (this tile's part) = dS K, staged (f32, dq_accum layout) for flush_dq.
    {
      float acc_dq[2][kNIdq][4];
      zero(acc_dq);
      warp_gemm<2, kNIdq, kBlockN, Operand::kA, kBlockN, Operand::kBTrans, kD>(
          acc_dq, sdS, wm * 32, sK, wn * (kD / 4), lane);
      FLASH_UNROLL
      for (int mi = 0; mi < 2; ++mi)
        FLASH_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int r = wm * 32 + mi * 16 + frag_row(lane, 2 * hf);
          const int64_t t = tok0 + m0 + r;  // the token (its swizzle)
          FLASH_UNROLL
          for (int ni = 0; ni < kNIdq; ++ni) {
            const int col = wn * (kD / 4) + ni * 8 + frag_col(lane, 0);
            st_shared_f32x2(sdQ + 4 * (r * kD + dq_row_offset(t, col)),
                            acc_dq[mi][ni][2 * hf], acc_dq[mi][ni][2 * hf + 1]);
          }
        }
#if FLASH_BULK_DQ
      fence_proxy_async();  // the stores above, visible to the copy engine after B1
#endif
    }

    warp_gemm<2, kNIdkv, kBlockM, Operand::kATrans, kBlockN, Operand::kBTrans, kD>(
        acc_dv, sP, wk * 32, sdO, wd * (kD / 2), lane);
    warp_gemm<2, kNIdkv, kBlockM, Operand::kATrans, kBlockN, Operand::kBTrans, kD>(
        acc_dk, sdS, wk * 32, sQ, wd * (kD / 2), lane);
  }
  cp_async_wait_all();
  if (n_iter > 0) {
    __syncthreads();  // the last staging tile complete
    flush_dq(h, m0);
#if FLASH_BULK_DQ
    if (tid == 0) bulk_wait();  // shared memory read and dq_accum written before exit
#endif
  }

  // dK = scale dS^T Q, dV: bf16 pairs straight from the accumulators.
  FLASH_UNROLL
  for (int mi = 0; mi < 2; ++mi)
    FLASH_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const int j = wk * 32 + mi * 16 + frag_row(lane, 2 * hf);  // within the tile
      if (n0 + j >= L) continue;
      const int64_t o = k_offset + j * krow + wd * (kD / 2);
      bf16* dk_row = p.dk + o;
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
void run_flash_bwd(const Params& p, const Grid& g, cudaStream_t stream) {
  using C = BwdConfig<kD>;
  auto kernel = flash_bwd_kernel<kD>;
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    C::kSmemBytes));
    return true;
  }();
  (void)configured;
  // Launch order (bwd_block): sections of (kv head, sequence) pairs whose q, dO (bf16) and
  // dQ accumulator (f32) rows take about 24 MB at most, a power of two pairs (at least one).
  Params q = p;
  const int64_t pair_bytes = int64_t{g.max_seqlen_q} * (p.num_heads / p.num_kv_heads) * kD * 8;
  const int64_t pairs = int64_t{p.num_kv_heads} * g.num_seqs;
  int64_t section = 1;
  while (section * 2 * pair_bytes <= (int64_t{24} << 20) && section < pairs) section *= 2;
  q.bwd_section = static_cast<int>(section);
  const dim3 grid(static_cast<unsigned>(ceil_div(g.max_seqlen_k, C::kBlockN)),
                  static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(g.num_seqs));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(q);
  check_launch("flash_bwd_kernel");
}

#endif  // FLASH_EMULATE

}  // namespace engine::cuda::flash
