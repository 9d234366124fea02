// Flash attention forward on Hopper (sm_90a): wgmma, TMA and warp specialisation (FlashAttention-3
// style), head dims 64 and 128, the contract of flash_fwd.cuh (same out, same lse) for qkv's own
// keys (no separate kv: the launcher keeps that case on the mma.sync kernel).
//
// Work item: kBlockM = 128 query rows (a q tile) of one (q head h, sequence s), 64 per consumer
// warpgroup: two (240 registers per thread by setmaxnreg), plus a producer warpgroup (24
// registers) of which one thread issues every copy. (D = 64 too: with three, kBlockM 192 at 160
// registers, its consumers spilled and a 1024-token sequence left its last tile a third full.)
// The grid is persistent (one block per SM, no more than the items): block b takes item b, then
// the next free item of a global counter (atomicAdd by the producer), in the item order below
// (fwd_item: groups of (head, sequence) pairs, longest causal rows first within a group); the
// producer hands each item to the consumers with its Q tile (the item index in shared memory,
// published by the q_full arrival; -1 ends the block) and loads the next item's Q and first keys
// while the consumers finish the last one (q_empty: every consumer has done its last S = Q K^T of
// the item; at D = 128, every consumer warp has its Q fragments).
// The producer loads the Q tile once per item and then the K and V tiles of kBlockN = 128 keys,
// from the last visible key tile down to the first (causal: the diagonal tile first), into a
// 2-stage ring (stage and phase count key tiles across items), all by TMA; stage s has the
// barriers k_full[s] and v_full[s] (the tile's bytes have landed), k_empty[s] and v_empty[s] (one
// arrival per consumer warpgroup once its wgmma reading K[s], V[s] have retired): K[s] is free
// again as soon as S is done, so the next K tile lands a whole tile ahead.
// qkv is one 3-D tensor map: (64 elements, (H + 2 Hkv) D / 64 column blocks, T tokens), box
// (64, 1, 64 rows) in the 128-byte swizzle (cuda/common/sm90.cuh): a tile of `rows` tokens x D is
// D / 64 column blocks of rows / 64 boxes, column block c at c * rows * 128 bytes. Rows past T
// are zero-filled; rows past the sequence's end inside T (the next sequence's) are loaded, their
// keys masked (-inf) and their query rows never stored.
//
// Consumer warpgroup (64 rows; thread = the wgmma accumulator fragment: warp w of the group rows
// 16 w + lane / 4 and + 8, columns 8 j + 2 (lane % 4) and + 1 of every n8 block j):
//   S = Q K^T   wgmma m64n128k16, B = K from shared memory (K-major), A = Q from registers (D =
//               128: loaded once per item) or shared memory (D = 64, K-major), D / 16 steps
//   online softmax in registers as flash_fwd.cuh (exp2 with scale * log2(e) folded in)
//   O += P V    wgmma m64nDk16, A = P from registers (bf16, the accumulator layout of S is the A
//               fragment layout), B = V from shared memory MN-major (transposed), 128 / 16 steps
// Within a warpgroup the S product of tile i + 1 is issued before the P V product of tile i and
// the softmax of tile i + 1 runs while P V is in flight (only the rescale of O waits for it);
// the warpgroups overlap each other's softmax and products on the tensor cores as they come.
// Masks only where a tile crosses the diagonal, the window edge or the sequence's end; tiles
// wholly invisible are never loaded. The epilogue stores O (bf16, rows inside the sequence) and
// lse straight from the registers.
//
// Item order (fwd_item): the (head, sequence) pairs are taken in groups whose K and V fit in
// 32 MiB of the 50 MiB L2, so the blocks running at once share the keys of few pairs; the plain
// longest-first order spreads them over every pair and the keys are read from memory again and
// again (slower at both head dims: docs/PERF.md).
//
// Shared memory: Q kBlockM x D, 2 stages of K and V 128 x D each: 160 KiB (D = 128) / 80 KiB
// (D = 64) + barriers; one block per SM.
#include <algorithm>
#include <limits>

#include "core/buffer.h"
#include "cuda/attention/flash_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/attention/flash_sm90.cuh"
#include "cuda/common/sm90.cuh"

namespace engine::cuda::flash {
namespace {

template <int kD>
struct Sm90Config {
  static constexpr int kConsumers = 2;  // warpgroups of 64 query rows (the top of this file)
  static constexpr int kBlockM = 64 * kConsumers, kBlockN = 128;
  static constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup
  // Registers per thread after setmaxnreg (the block is launched with 65536 / kThreads rounded
  // down to 8 a thread, 168; setmaxnreg only moves them between warpgroups: setmaxnreg_fits).
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(sm90::setmaxnreg_fits(kThreads, kProducerRegs + kConsumers * kConsumerRegs),
                "register file");
  static constexpr int kStages = 2;
  static constexpr int kBoxRows = 64;        // rows per TMA box
  static constexpr int kColBlocks = kD / 64;  // 64-column boxes per row of a tile
  static_assert(kColBlocks * 64 == kD, "a row of a tile is whole 64-column boxes");
  static constexpr uint32_t kQBytes = kBlockM * kD * 2, kKBytes = kBlockN * kD * 2;
  static constexpr uint32_t kBarOffset = kQBytes + kStages * 2 * kKBytes;
  static constexpr size_t kSmemBytes = kBarOffset + 8 * (3 + 4 * kStages) + 1024;  // + align slack
};

// What the kernel reads besides the tensor map (by value, small).
struct Sm90Params {
  bf16* out;                  // (T, H, D)
  float* lse;                 // (T, H)
  const int32_t* cu_seqlens;  // (S + 1)
  int num_heads, num_kv_heads;
  float scale;
  int window;
  int num_seqs, m_blocks;  // S, q tiles of the longest sequence
  int group;               // grouped item order: (head, sequence) pairs per group (fwd_item)
  int* next_item;          // zeroed: items past the first gridDim.x are handed out from here
  bool causal;
};

// Work item w (q tile of one q head of one sequence), in the order blocks take them: the
// (head, sequence) pairs (heads innermost) in groups of p.group, whose keys and values fit in L2
// together, group after group, and in a group the last q tiles (longest causal rows) of every
// pair first: the blocks share the keys of few pairs at a time, and the shortest items (the
// first q tiles of the last group) still come last.
struct FwdItem {
  int h, seq_begin, L, m0;
};
template <int kBlockM>
__device__ __forceinline__ FwdItem fwd_item(const Sm90Params& p, int64_t w) {
  const int pairs = p.num_heads * p.num_seqs;
  const int64_t group_items = int64_t{p.group} * p.m_blocks;
  const int gi = static_cast<int>(w / group_items);
  const int r = static_cast<int>(w - gi * group_items);
  const int in_group = min(p.group, pairs - gi * p.group);
  const int z = r / in_group;
  const int rem = gi * p.group + (r - z * in_group);
  const int seq = rem / p.num_heads;
  FwdItem it;
  it.h = rem - seq * p.num_heads;
  it.seq_begin = p.cu_seqlens[seq];
  it.L = p.cu_seqlens[seq + 1] - it.seq_begin;
  it.m0 = (p.m_blocks - 1 - z) * kBlockM;
  return it;
}

#ifdef ENGINE_SM90A
using namespace sm90;

template <int kD>
__device__ __forceinline__ void wgmma_pv(float (&o)[kD / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kD == 128)
    wgmma_m64n128k16_rs(o, a, b);
  else
    wgmma_m64n64k16_rs(o, a, b);
}
#endif  // ENGINE_SM90A

template <int kD>
__global__ void __launch_bounds__(Sm90Config<kD>::kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ CUtensorMap map, const Sm90Params p) {
#ifdef ENGINE_SM90A
  using C = Sm90Config<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kColBlocks = C::kColBlocks;
  constexpr int kStages = C::kStages, kBoxRows = C::kBoxRows;
  // D = 128: each warpgroup's Q rows in registers for the item (the A operand of S = Q K^T), read
  // once by ldmatrix, so the tensor cores read only K from shared memory; Q's stage is released
  // as soon as every consumer warp has its fragments (q_empty: one arrival per warp). D = 64 is
  // slower this way, mostly from the early release (docs/PERF.md), and reads Q from shared memory.
  constexpr bool kQRegs = kD == 128;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base;
  auto sK = [&](int s) { return base + C::kQBytes + s * 2 * C::kKBytes; };
  auto sV = [&](int s) { return base + C::kQBytes + s * 2 * C::kKBytes + C::kKBytes; };
  const uint32_t q_full = base + C::kBarOffset, q_empty = q_full + 8;
  auto k_full = [&](int s) { return q_full + 16 + 8 * s; };
  auto v_full = [&](int s) { return q_full + 16 + 8 * kStages + 8 * s; };
  auto k_empty = [&](int s) { return q_full + 16 + 16 * kStages + 8 * s; };
  auto v_empty = [&](int s) { return q_full + 16 + 24 * kStages + 8 * s; };
  // The item the producer hands the consumers with each Q tile (-1: no more), published by the
  // arrival on q_full, read before the consumers release Q (q_empty).
  volatile int64_t* s_item = reinterpret_cast<volatile int64_t*>(
      smem_raw + (base - smem_u32(smem_raw)) + C::kBarOffset + 16 + 32 * kStages);

  const int H = p.num_heads, Hkv = p.num_kv_heads;
  const int64_t items = int64_t{H} * p.num_seqs * p.m_blocks;
  // The visible key tiles of an item: [n_first, n_last].
  auto tile_range = [&](const FwdItem& it, int& n_first, int& n_last) {
    const int key_lo = p.window > 0 ? max(0, it.m0 - p.window + 1) : 0;
    const int key_hi = p.causal ? min(it.L, it.m0 + kBlockM) : it.L;
    n_first = key_lo / kBlockN;
    n_last = (key_hi - 1) / kBlockN;
  };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, kQRegs ? 4 * C::kConsumers : C::kConsumers);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), C::kConsumers);
      mbar_init(v_empty(s), C::kConsumers);
    }
    mbar_init_fence();
    fence_proxy_async();
  }
  __syncthreads();

  if (warp >= 4 * C::kConsumers) {  // producer warpgroup: warp 4 kConsumers, lane 0 issues
    setmaxnreg_dec<C::kProducerRegs>();
    if (warp == 4 * C::kConsumers && lane == 0) {
      int kt = 0, j = 0;  // key tiles and items of this block so far
      // Items in order: blockIdx.x first, then the next free one (dynamic: long items early).
      for (int64_t w = blockIdx.x; w < items;
           w = gridDim.x + static_cast<int64_t>(atomicAdd(p.next_item, 1))) {
        const FwdItem it = fwd_item<kBlockM>(p, w);
        if (it.m0 >= it.L) continue;
        int n_first, n_last;
        tile_range(it, n_first, n_last);
        const int kv = it.h / (H / Hkv);
        if (j > 0) mbar_wait(q_empty, (j - 1) & 1);  // every consumer is done with the last Q
        *s_item = w;
        mbar_expect_tx(q_full, C::kQBytes);
        for (int c = 0; c < kColBlocks; ++c)
          for (int b = 0; b < kBlockM / kBoxRows; ++b)
            tma_load_3d(sQ + (c * kBlockM + b * kBoxRows) * 128, &map, 0, it.h * kColBlocks + c,
                        it.seq_begin + it.m0 + b * kBoxRows, q_full);
        const int k_col = (H + kv) * kColBlocks, v_col = (H + Hkv + kv) * kColBlocks;
        for (int n = n_last; n >= n_first; --n, ++kt) {
          const int s = kt % kStages;
          const int key0 = it.seq_begin + n * kBlockN;
          if (kt >= kStages) mbar_wait(k_empty(s), ((kt / kStages) - 1) & 1);
          mbar_expect_tx(k_full(s), C::kKBytes);
          for (int c = 0; c < kColBlocks; ++c)
            for (int b = 0; b < kBlockN / kBoxRows; ++b)
              tma_load_3d(sK(s) + (c * kBlockN + b * kBoxRows) * 128, &map, 0, k_col + c,
                          key0 + b * kBoxRows, k_full(s));
          if (kt >= kStages) mbar_wait(v_empty(s), ((kt / kStages) - 1) & 1);
          mbar_expect_tx(v_full(s), C::kKBytes);
          for (int c = 0; c < kColBlocks; ++c)
            for (int b = 0; b < kBlockN / kBoxRows; ++b)
              tma_load_3d(sV(s) + (c * kBlockN + b * kBoxRows) * 128, &map, 0, v_col + c,
                          key0 + b * kBoxRows, v_full(s));
        }
        ++j;
      }
      if (j > 0) mbar_wait(q_empty, (j - 1) & 1);
      *s_item = -1;
      mbar_arrive(q_full);
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<C::kConsumerRegs>();
  const int wg = warp >> 2, wq = warp & 3;
  const int row_base = wg * 64 + wq * 16 + (lane >> 2);  // tile row of fragment rows hf = 0 (+ 8)
  const float c = p.scale * kLog2e;
  const bool leader = (tid & 127) == 0;
  // Q of this warpgroup: column block kk / 4 at kk / 4 * kBlockM * 128, rows 64 wg on.
  auto q_desc = [&](int kk) {
    return smem_desc_sw128(sQ + (kk >> 2) * kBlockM * 128 + wg * 64 * 128 + (kk & 3) * 32, 16);
  };
  auto k_desc = [&](int s, int kk) {
    return smem_desc_sw128(sK(s) + (kk >> 2) * kBlockN * 128 + (kk & 3) * 32, 16);
  };
  auto v_desc = [&](int s, int kk) { return smem_desc_sw128(sV(s) + kk * 2048, kBlockN * 128); };

  float o[kD / 2];
  float sc[kBlockN / 2];
  uint32_t pa[kBlockN / 16][4];
  float m_run[2], l_run[2];

  uint32_t qa[kD / 16][4];  // D = 128: this warp's Q rows, the A operand of S (k16 slice kk)
  // S = Q K[s]^T, issued (not waited for).
  auto issue_s = [&](int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if constexpr (kQRegs)
        wgmma_m64n128k16_rs<0>(sc, qa[kk], k_desc(s, kk), kk > 0);
      else
        wgmma_m64n128k16_ss(sc, q_desc(kk), k_desc(s, kk), kk > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) wgmma_pv<kD>(o, pa[kk], v_desc(s, kk));
    wgmma_commit();
  };
  // Masks key tile n of S for the rows of item (L, m0), turns sc into the softmax numerators,
  // updates m_run, l_run and returns the rescale factors of O (applied once P V is done).
  auto softmax = [&](int n, int L, int m0, float (&alpha)[2]) {
    const int n0 = n * kBlockN;
    const bool need_mask = n0 + kBlockN > L || (p.causal && n0 + kBlockN - 1 > m0) ||
                           (p.window > 0 && m0 + kBlockM - 1 - n0 >= p.window);
    if (need_mask) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + row_base + 8 * hf;
        const int hi = (p.causal ? min(i + 1, L) : L) - n0;
        const int lo = (p.window > 0 ? i - p.window + 1 : 0) - n0;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int col = j * 8 + 2 * (lane & 3) + x;
            if (col >= hi || col < lo) sc[4 * j + 2 * hf + x] = -INFINITY;
          }
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = m_run[hf];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
        mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * hf], sc[4 * j + 2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_scaled = mx == -INFINITY ? 0.f : mx * c;
      alpha[hf] = ex2(m_run[hf] * c - m_scaled);
      m_run[hf] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const float pe = ex2(fmaf(sc[4 * j + 2 * hf + x], c, -m_scaled));
          sc[4 * j + 2 * hf + x] = pe;
          sum += pe;
        }
      l_run[hf] = l_run[hf] * alpha[hf] + sum;
    }
  };
  auto to_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pa[kk][0] = pack_bf16(sc[8 * kk + 0], sc[8 * kk + 1]);
      pa[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };

  int kt = 0;  // key tiles of this block so far (as the producer counts them)
  for (int j = 0;; ++j) {
    mbar_wait(q_full, j & 1);
    const int64_t w = *s_item;
    if (w < 0) break;
    if constexpr (kQRegs) {
      ldmatrix_a(qa, sQ, kBlockM, wg * 64 + wq * 16, lane);
      __syncwarp();
      if (lane == 0) mbar_arrive(q_empty);  // this warp has read Q and the item index
    }
    const FwdItem it = fwd_item<kBlockM>(p, w);
    int n_first, n_last;
    tile_range(it, n_first, n_last);
    const int n_tiles = n_last - n_first + 1;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.f;

    {
      const int s = kt % kStages;
      mbar_wait(k_full(s), (kt / kStages) & 1);
      issue_s(s);
      wgmma_wait<0>();
      reg_fence(sc);
      if (leader) {
        mbar_arrive(k_empty(s));
        if (!kQRegs && n_tiles == 1) mbar_arrive(q_empty);  // the item's last use of Q
      }
      float alpha[2];
      softmax(n_last, it.L, it.m0, alpha);
      to_p();
    }
    for (int i = 1; i < n_tiles; ++i) {
      const int g = kt + i, s = g % kStages, prev = (g - 1) % kStages;
      mbar_wait(k_full(s), (g / kStages) & 1);
      issue_s(s);
      mbar_wait(v_full(prev), ((g - 1) / kStages) & 1);
      issue_pv(prev);
      wgmma_wait<1>();  // S of tile i is done, P V of tile i - 1 may still run
      reg_fence(sc);
      if (leader) {
        mbar_arrive(k_empty(s));
        if (!kQRegs && i == n_tiles - 1) mbar_arrive(q_empty);
      }
      float alpha[2];
      softmax(n_last - i, it.L, it.m0, alpha);
      wgmma_wait<0>();
      reg_fence(o);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) reg_fence(pa[kk]);
      if (leader) mbar_arrive(v_empty(prev));
#pragma unroll
      for (int jj = 0; jj < kD / 8; ++jj) {
        o[4 * jj + 0] *= alpha[0];
        o[4 * jj + 1] *= alpha[0];
        o[4 * jj + 2] *= alpha[1];
        o[4 * jj + 3] *= alpha[1];
      }
      to_p();
    }
    {
      const int g = kt + n_tiles - 1, last = g % kStages;
      mbar_wait(v_full(last), (g / kStages) & 1);
      issue_pv(last);
      wgmma_wait<0>();
      reg_fence(o);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) reg_fence(pa[kk]);
      if (leader) mbar_arrive(v_empty(last));
    }
    kt += n_tiles;

    // Epilogue: normalise, lse, store the rows inside the sequence (the producer already loads
    // the next item's Q and keys meanwhile).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int i = it.m0 + row_base + 8 * hf;
      const int64_t t = it.seq_begin + static_cast<int64_t>(min(i, it.L - 1));
      if (i < it.L && (lane & 3) == 0) p.lse[t * H + it.h] = m_run[hf] * p.scale + logf(l);
      store_row_pairs<kD / 8>(p.out + (t * H + it.h) * kD, i < it.L, lane, [&](int j) {
        return pack_bf16(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
      });
    }
  }
#endif  // ENGINE_SM90A
}

template <int kD>
bool kernel_ready() {
  static const bool ok = [] {
    if (!sm90::sm90_kernel_runs(reinterpret_cast<const void*>(flash_fwd_sm90_kernel<kD>)) ||
        sm90::tensor_map_encoder() == nullptr)
      return false;
    CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_sm90_kernel<kD>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(Sm90Config<kD>::kSmemBytes)));
    return true;
  }();
  return ok;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  return n;
}

template <int kD>
void launch(const Params& p, const Grid& g, cudaStream_t stream) {
  using C = Sm90Config<kD>;
  const CUtensorMap map =
      column_block_map(p.q, p.q_row, p.num_tokens, C::kBoxRows, "attention_forward (sm90)");
  const int m_blocks = static_cast<int>(ceil_div(g.max_seqlen_q, C::kBlockM));
  Sm90Params kp{};
  kp.out = p.out;
  kp.lse = p.lse;
  kp.cu_seqlens = p.cu_seqlens_q;
  kp.num_heads = p.num_heads;
  kp.num_kv_heads = p.num_kv_heads;
  kp.scale = p.scale;
  kp.window = p.window;
  kp.num_seqs = g.num_seqs;
  kp.m_blocks = m_blocks;
  kp.causal = p.causal;
  // The item order: groups of pairs whose keys and values (max_seqlen rows of D, K and V; shared
  // by the q heads of a kv head) fit in 32 MiB of L2.
  const int64_t pairs = int64_t{p.num_heads} * g.num_seqs;
  const int64_t pair_bytes = int64_t{g.max_seqlen_q} * kD * 2 * 2;
  kp.group = static_cast<int>(std::clamp<int64_t>(
      (int64_t{32} << 20) / pair_bytes * (p.num_heads / p.num_kv_heads), 1, pairs));
  const int64_t items = int64_t{p.num_heads} * g.num_seqs * m_blocks;
  const int64_t blocks = std::min<int64_t>(items, sm_count());
  ENSURE(items <= std::numeric_limits<int32_t>::max(), "attention_forward (sm90): ", items,
         " q tiles");
  Buffer next_item(sizeof(int), Device::CUDA);  // back to the caching allocator on return:
  kp.next_item = static_cast<int*>(next_item.data());  // its later users follow on the stream
  CUDA_CHECK(cudaMemsetAsync(kp.next_item, 0, sizeof(int), stream));
  const unsigned nb = static_cast<unsigned>(blocks);
  flash_fwd_sm90_kernel<kD><<<nb, C::kThreads, C::kSmemBytes, stream>>>(map, kp);
  check_launch("flash_fwd_sm90_kernel");
}

}  // namespace

bool flash_fwd_sm90_available(int head_dim) {
  if (head_dim == 64) return kernel_ready<64>();
  if (head_dim == 128) return kernel_ready<128>();
  return false;
}

bool flash_fwd_sm90_eligible(const Params& p, const Grid& g) {
  return (p.head_dim == 64 || p.head_dim == 128) && p.k == p.q + p.num_heads * p.head_dim &&
         p.kv_row == p.q_row && p.cu_seqlens_k == p.cu_seqlens_q &&
         reinterpret_cast<uintptr_t>(p.q) % 16 == 0 &&
         flash_fwd_sm90_available(p.head_dim);
}

int sm90_sm_count() { return sm_count(); }

void run_flash_fwd_sm90(const Params& p, const Grid& g, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch<64>(p, g, stream);
  else
    launch<128>(p, g, stream);
}

}  // namespace engine::cuda::flash
