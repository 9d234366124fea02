// The Hopper attention backward's configuration (flash_bwd_sm90.cu, which includes it alone):
// tiles, stages and shared memory layout per head dim, the kernel parameters, and the work item
// a block takes (a key tile of one (kv head, sequence) pair, in flash_bwd.cuh's launch order).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/attention/flash_common.cuh"
#include "cuda/common/sm90.cuh"

namespace engine::cuda::flash {

struct BwdTiles {
  static constexpr int kBlockN = 128, kBlockM = 64;  // keys per item, queries per q tile
};

template <int kHeadDim>
struct BwdSm90Config : BwdTiles {
  static constexpr int kD = kHeadDim;
  static constexpr int kColBlocks = kD / 64;  // 64-column boxes per row of a tile
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(sm90::setmaxnreg_fits(kThreads, kProducerRegs + kConsumers * kConsumerRegs),
                "register file");
  // Q / dO stages: three, as a tile's dK (which reads Q) retires only in the next tile (below):
  // faster than two stages with dK retired in its own tile (docs/PERF.md).
  static constexpr int kStages = 3;
  static constexpr uint32_t kKVBytes = kBlockN * kD * 2;  // [column block][128][64]
  static constexpr uint32_t kQBytes = kBlockM * kD * 2;   // [column block][64][64]
  // K and V of kKVStages items (D = 64: two, so the next item's arrive while this one runs; D =
  // 128 has no room): stage t's K at t * 2 kKVBytes, its V kKVBytes further.
  static constexpr int kKVStages = kHeadDim == 64 ? 2 : 1;
  static constexpr uint32_t kOffK = 0, kOffQ = kKVStages * 2 * kKVBytes;
  static constexpr uint32_t kOffdO = kOffQ + kStages * kQBytes;
  static constexpr uint32_t kOffdS = kOffdO + kStages * kQBytes;         // [128 keys][64 q] bf16
  // dQ staging, f32: [64][D]
  static constexpr uint32_t kOffdQ = kOffdS + kBlockN * kBlockM * 2;
  static constexpr uint32_t kOffLse = kOffdQ + kBlockM * kD * 4;       // [stage][64] f32
  static constexpr uint32_t kOffDsum = kOffLse + kStages * kBlockM * 4;  // [stage][64] f32
  static constexpr uint32_t kOffBar = kOffDsum + kStages * kBlockM * 4;
  // Barriers kv_full[kKVStages], q_full[kStages], q_empty[kStages], kv_empty[kKVStages], then
  // the item indices s_item[kKVStages].
  static constexpr size_t kSmemBytes = kOffBar + 24 * kKVStages + 16 * kStages + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
};

struct BwdSm90Params {
  const float* lse;           // (T, H)
  const float* dsum;          // (T, H)
  float* dq_accum;            // (H, T, D), flash_layout.h
  bf16* dk;                   // dqkv's k heads (row stride q_row); dv = dk + Hkv D
  const int32_t* cu_seqlens;  // (S + 1)
  int num_tokens, q_row;
  int num_heads, num_kv_heads;
  float scale;
  int window;
  int bwd_section, bwd_tail;
  int n_blocks, num_seqs;  // key tiles of the longest sequence, S
  int64_t items;           // n_blocks * Hkv * S
  int* next_item;          // zeroed: items past the first gridDim.x are handed out from here
  bool causal;
};

// Work item w: key tile n_block of one (kv head, sequence) pair in the launch order of
// flash_bwd.cuh (bwd_block); valid when n0 < L.
struct BwdItem {
  int seq_begin, L, n0, kv, m_begin, tiles;  // q tiles [m_begin, m_begin + 64 tiles)
};
__device__ __forceinline__ BwdItem bwd_item(const BwdSm90Params& p, int64_t w) {
  constexpr int kBlockN = BwdTiles::kBlockN, kBlockM = BwdTiles::kBlockM;
  const int Hkv = p.num_kv_heads;
  const BwdBlock blk = bwd_block(w, p.n_blocks, int64_t{Hkv} * p.num_seqs, p.bwd_section, p.bwd_tail);
  const int seq = static_cast<int>(blk.pair / Hkv);
  BwdItem b;
  b.kv = static_cast<int>(blk.pair % Hkv);
  b.seq_begin = p.cu_seqlens[seq];
  b.L = p.cu_seqlens[seq + 1] - b.seq_begin;
  b.n0 = blk.n_block * kBlockN;  // the tile's first key
  // q rows that see any key of the tile: [i_lo, i_hi); q tiles [m_begin, m_end).
  const int i_lo = p.causal ? b.n0 : 0;
  const int i_hi = p.window > 0 ? min(b.L, b.n0 + kBlockN - 1 + p.window) : b.L;
  b.m_begin = i_lo / kBlockM * kBlockM;
  const int m_end = i_hi > i_lo ? (i_hi + kBlockM - 1) / kBlockM * kBlockM : b.m_begin;
  b.tiles = (m_end - b.m_begin) / kBlockM;
  return b;
}

// An item's q tiles run head by head (h), tile by tile (mt) within the head: no division per tile.
__device__ __forceinline__ void next_q_tile(int& h, int& mt, int tiles) {
  if (++mt == tiles) mt = 0, ++h;
}

}  // namespace engine::cuda::flash
