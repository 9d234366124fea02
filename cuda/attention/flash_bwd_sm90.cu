// Flash attention backward on Hopper (sm_90a): wgmma, TMA and warp specialisation, head dims 64
// and 128, the contract and the surroundings of flash_bwd.cuh (same algorithm, same dq_accum
// layout and bulk reduction; flash.cu runs dsum_kernel before and dq_convert_kernel after), for
// qkv's own keys (no separate kv: the launcher keeps that case on the mma.sync kernel).
//
// Work item: kBlockN = 128 keys (a key tile) of one (kv head, sequence), items in the launch order
// of flash_bwd.cuh (bwd_block); the grid is persistent (one block per SM, no more than the items):
// block b takes item b, then the next free one of a global counter (atomicAdd by the producer), and
// the producer hands each item to the consumers with its K and V tiles (the item index in shared
// memory, published by the kv_full arrival; -1 ends the block). K and V have two stages at D = 64
// (the next item's load while this one runs) and one at D = 128 (no room: its next K and V load as
// soon as the consumers are done with the last ones, kv_empty, while they store its dK and dV). Two
// consumer warpgroups own keys [64 w, 64 w + 64) (warps 0-7, 240 registers each by setmaxnreg); of
// the producer warpgroup (warps 8-11, 24 registers) warp 8 loads. Per item the producer loads K and
// V once (TMA), then for every (q head of the kv group, q tile of kBlockM = 64 rows that sees any
// of the keys) the tile's Q and dO (TMA) and its lse (times log2 e; +inf for rows past the
// sequence, whose P is then 0) and dsum (0 past the sequence) (plain loads by the warp's 32 lanes
// into shared memory) into a 3-stage ring (stage and phase count q tiles across items): q_full[s]
// (32 arrivals, one with the TMA bytes), q_empty[s] (one arrival per consumer warpgroup, once the
// tile's dK has retired: in the next q tile, whose first wait covers it, or at the item's end).
// Per q tile, consumer warpgroup w (its 64 keys as the rows of the transposed products):
//   S^T = K_w Q^T, dP^T = V_w dO^T        wgmma m64n64k16, both operands K-major in shared memory
//                                          (D = 64: K_w and V_w from registers, read per item)
//   P^T = 2^(S^T c - lse log2 e) (0 where masked)   (registers; while dP^T runs)
//   dV_w += P^T dO                         wgmma m64n128k16, A = P^T from registers (bf16), B = dO
//                                          MN-major (transposed) from shared memory; runs while
//   dS^T = P^T (dP^T - dsum)               is computed (registers) and stored (bf16, shared)
//   dQ[:, n w .. n w + n - 1] = dS K[:, n w ..]   n = D / 2 columns per warpgroup, over all 128
//                                          keys of the block: wgmma m64n64k16 (D = 128) or
//                                          m64n32k16 (D = 64), A = dS from the dS^T tile (written
//                                          by both warpgroups: MN-major), B = K MN-major
//   dK_w += dS^T Q                         as dV; runs while dQ goes to the staging tile and
//                                          into the next q tile's S^T and dP^T
// with c = scale * log2(e). The dQ halves go into a shared f32 staging tile in dq_accum's own
// layout (flash_layout.h), and one thread adds the tile's rows inside the sequence into
// dq_accum with one bulk reduction (cp.reduce.async.bulk .add.f32). (Splitting dQ's keys instead
// at D = 64, two partial tiles and two reductions a q tile, was slower: docs/PERF.md.)
// Named barrier 1 (the 256 consumer threads) twice per tile: (a) the dS^T tile is complete (and
// the previous reduction has read the staging tile: its issuing thread waits for that first),
// (d) the staging tile is complete; (d) also orders every dQ product of a tile before the next
// tile's dS^T stores.
// D = 64: warpgroup 1 skips its products for the q tiles none of whose queries see its keys
// (q_tile's kDead: the causal diagonal's first q tile, a sequence ending in the key tile's first
// half); it stores zeros as its dS^T rows and runs only its share of dQ.
// Masks only where the tile crosses the diagonal, the window edge or the sequence end (keys past
// the end get P = 0, so they add nothing to dQ; their dK, dV rows are never written). Blocks
// (items) whose keys no query sees write dK = dV = 0. dK = scale dS^T Q and dV go out as bf16
// straight from the registers, 8 bytes a store (store_row_pairs: adjacent lanes swap one pair).
//
// Shared memory: K, V 128 x D (two stages at D = 64), Q, dO 3 stages of 64 x D (bf16), dS^T
// 128 x 64 bf16, dQ staging 64 x D f32, lse and dsum 3 x 2 x 64 f32: 210 KiB (D = 128), 146 KiB
// (D = 64) + barriers; one block per SM. The layout, the kernel parameters and the work items
// are in flash_bwd_sm90_config.cuh.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "core/buffer.h"
#include "cuda/attention/flash_bwd_sm90_config.cuh"
#include "cuda/attention/flash_common.cuh"
#include "cuda/attention/flash_sm90.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/sm90.cuh"

namespace engine::cuda::flash {
namespace {

template <int kHeadDim>
__global__ void __launch_bounds__(BwdSm90Config<kHeadDim>::kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ CUtensorMap map_qkv,
                          const __grid_constant__ CUtensorMap map_do, const BwdSm90Params p) {
#ifdef ENGINE_SM90A
  using namespace sm90;
  using C = BwdSm90Config<kHeadDim>;
  constexpr int kD = C::kD, kBlockN = C::kBlockN, kBlockM = C::kBlockM, kStages = C::kStages;
  constexpr int kColBlocks = C::kColBlocks;
  // dQ: the warpgroups split its columns, each over all kBlockN keys.
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
  constexpr int kDqCols = kD / C::kConsumers;
  constexpr int kDqSteps = kBlockN / 16;
  constexpr int kFull = 0, kDead = 1;  // q tile modes (q_tile)
  constexpr bool kKVRegs = kD == 64;     // K_w and V_w in registers (below)
  // d (64 x kD) += A (registers) B (MN-major, shared), one k16 step.
  auto wgmma_rs = [](float (&d)[kD / 2], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (kD == 128)
      wgmma_m64n128k16_rs(d, a, b);
    else
      wgmma_m64n64k16_rs(d, a, b);
  };
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - smem_u32(smem_raw));
  constexpr int kKVStages = C::kKVStages;
  auto sK = [&](int t) { return base + C::kOffK + t * 2 * C::kKVBytes; };
  auto sV = [&](int t) { return sK(t) + C::kKVBytes; };
  const uint32_t sdS = base + C::kOffdS,
                 sdQ = base + C::kOffdQ;
  auto sQ = [&](int s) { return base + C::kOffQ + s * C::kQBytes; };
  auto sdO = [&](int s) { return base + C::kOffdO + s * C::kQBytes; };
  float* sLse = reinterpret_cast<float*>(smem + C::kOffLse);
  float* sDsum = reinterpret_cast<float*>(smem + C::kOffDsum);
  const uint32_t bars = base + C::kOffBar;
  auto kv_full = [&](int t) { return bars + 8 * t; };
  auto q_full = [&](int s) { return bars + 8 * kKVStages + 8 * s; };
  auto q_empty = [&](int s) { return bars + 8 * kKVStages + 8 * kStages + 8 * s; };

  auto kv_empty = [&](int t) { return bars + 8 * kKVStages + 16 * kStages + 8 * t; };
  // The item the producer hands the consumers with each K, V tile (-1: no more), published by
  // the kv_full arrival, read before the consumers release K and V (kv_empty).
  volatile int64_t* s_item =
      reinterpret_cast<volatile int64_t*>(smem + C::kOffBar + 16 * kKVStages + 16 * kStages);
  const int H = p.num_heads, Hkv = p.num_kv_heads, G = H / Hkv;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int t = 0; t < kKVStages; ++t) {
      mbar_init(kv_full(t), 1);
      mbar_init(kv_empty(t), C::kConsumers);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(q_full(s), 32);
      mbar_init(q_empty(s), C::kConsumers);
    }
    mbar_init_fence();
    fence_proxy_async();
  }
  __syncthreads();

  if (warp >= 4 * C::kConsumers) {  // producer warpgroup
    setmaxnreg_dec<C::kProducerRegs>();
    if (warp != 4 * C::kConsumers) return;
    int qt = 0, j = 0;  // q tiles and items of this block so far
    for (int64_t w = blockIdx.x; w < p.items;) {
      const BwdItem b = bwd_item(p, w);
      if (b.n0 < b.L) {
        const int t = j % kKVStages;  // every consumer is done with the stage's last K and V
        if (j >= kKVStages) mbar_wait(kv_empty(t), (j / kKVStages - 1) & 1);
        if (lane == 0) {
          s_item[t] = w;
          mbar_expect_tx(kv_full(t), 2 * C::kKVBytes);
          const int k_col = (H + b.kv) * kColBlocks, v_col = (H + Hkv + b.kv) * kColBlocks;
          for (int c = 0; c < kColBlocks; ++c)
            for (int half = 0; half < 2; ++half) {
              const uint32_t off = c * kBlockN * 128 + half * 64 * 128;
              const int row = b.seq_begin + b.n0 + 64 * half;
              tma_load_3d(sK(t) + off, &map_qkv, 0, k_col + c, row, kv_full(t));
              tma_load_3d(sV(t) + off, &map_qkv, 0, v_col + c, row, kv_full(t));
            }
        }
        const int n_iter = G * b.tiles;
        for (int it = 0, h = b.kv * G, mt = 0; it < n_iter; ++it, ++qt, next_q_tile(h, mt, b.tiles)) {
          const int s = qt % kStages;
          const int m0 = b.m_begin + mt * kBlockM;
          if (qt >= kStages) mbar_wait(q_empty(s), ((qt / kStages) - 1) & 1);
          for (int r = lane; r < kBlockM; r += 32) {
            const bool in = m0 + r < b.L;
            const int64_t t = b.seq_begin + static_cast<int64_t>(in ? m0 + r : 0);
            sLse[s * kBlockM + r] = in ? p.lse[t * H + h] * kLog2e : INFINITY;
            sDsum[s * kBlockM + r] = in ? p.dsum[t * H + h] : 0.f;
          }
          if (lane == 0) {
            mbar_expect_tx(q_full(s), 2 * C::kQBytes);
            for (int c = 0; c < kColBlocks; ++c) {
              tma_load_3d(sQ(s) + c * kBlockM * 128, &map_qkv, 0, h * kColBlocks + c,
                          b.seq_begin + m0, q_full(s));
              tma_load_3d(sdO(s) + c * kBlockM * 128, &map_do, 0, h * kColBlocks + c,
                          b.seq_begin + m0, q_full(s));
            }
          } else {
            mbar_arrive(q_full(s));
          }
        }
        ++j;
      }
      int next = 0;  // the next free item (dynamic: the long key tiles of a section early)
      if (lane == 0) next = atomicAdd(p.next_item, 1);
      w = gridDim.x + static_cast<int64_t>(__shfl_sync(0xffffffffu, next, 0));
    }
    const int t = j % kKVStages;
    if (j >= kKVStages) mbar_wait(kv_empty(t), (j / kKVStages - 1) & 1);
    if (lane == 0) {
      s_item[t] = -1;
      mbar_arrive(kv_full(t));
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<C::kConsumerRegs>();
  const int wg = warp >> 2, wq = warp & 3;
  const int key_row = wg * 64 + wq * 16 + (lane >> 2);  // block key of fragment row hf = 0 (+ 8)
  const float c = p.scale * kLog2e;
  const bool leader = (tid & 127) == 0;

  float dk[kD / 2], dv[kD / 2];

  // K-major operands: K / V rows 64 wg .. (A), Q / dO tile (B): column block kk / 4.
  auto kv_desc = [&](uint32_t tile, int kk) {
    return smem_desc_sw128(tile + (kk >> 2) * kBlockN * 128 + wg * 64 * 128 + (kk & 3) * 32, 16);
  };
  auto q_desc = [&](uint32_t tile, int kk) {
    return smem_desc_sw128(tile + (kk >> 2) * kBlockM * 128 + (kk & 3) * 32, 16);
  };

  int qt = 0;  // q tiles of this block so far (as the producer counts them)
  for (int item = 0;; ++item) {
    const int t = item % kKVStages;
    mbar_wait(kv_full(t), (item / kKVStages) & 1);
    const int64_t w = s_item[t];
    const uint32_t sK_t = sK(t), sV_t = sV(t);
    if (w < 0) break;
    // D = 64: this warpgroup's K and V rows in registers for the item (ka, va: the A operands
    // of S^T and dP^T, 16 registers each, read by ldmatrix_a as the forward's Q), so the tensor
    // cores read only Q and dO from shared memory for those products (faster: docs/PERF.md).
    // D = 128 has no registers for them (K alone spills).
    uint32_t ka[kD / 16][4], va[kD / 16][4];
    if constexpr (kKVRegs) {
      ldmatrix_a(ka, sK_t, kBlockN, wg * 64 + wq * 16, lane);
      ldmatrix_a(va, sV_t, kBlockN, wg * 64 + wq * 16, lane);
    }
    const BwdItem b = bwd_item(p, w);
    const int seq_begin = b.seq_begin, L = b.L, n0 = b.n0, kv = b.kv, tiles = b.tiles;
    const int n_iter = G * tiles;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk[i] = 0.f, dv[i] = 0.f;
    // One q tile: stage s, q head h, rows [m0, m0 + 64). kFull: as the top of this file. kDead
    // (D = 64 only): warpgroup 1 when none of the tile's queries sees any of its 64 keys (the
    // causal diagonal's first q tile, or a sequence ending in the key tile's first half): its
    // P^T and dS^T are 0, so it skips S^T, dP^T, dV and dK, stores zeros as its dS^T rows and
    // runs only its share of dQ. The modes are compile-time, each a whole issue-to-wait block: a
    // wgmma issued on a run-time condition between its issue and its wait makes ptxas serialise
    // every wgmma of the kernel (C7520); and the condition goes through __all_sync, or ptxas
    // cannot prove it warp-uniform and moves the loop's descriptor arithmetic off the uniform
    // datapath. D = 64 only: at D = 128 it is slower (warpgroup 0 alone takes about as long as
    // both, the warpgroups meeting at two barriers a tile, and the second variant costs the full
    // one). Skipping warpgroup 0's dQ over the dead keys as well, and the same idea in the
    // forward, were slower (docs/PERF.md).
    // Stage whose Q, dO, lse and dsum are read but whose dK may still run (-1: none): a q tile
    // leaves its dK in flight, and the next tile's first wait retires it.
    int held = -1;
    auto release_held = [&] {
      if (held >= 0 && leader) mbar_arrive(q_empty(held));
      held = -1;
    };
    auto q_tile = [&](int s, int h, int m0, auto mode) {
      constexpr int kMode = decltype(mode)::value;
      // A fragments: pa[kk][q] / da[kk][q] hold n8 block 2 kk + q / 2, row + 8 (q & 1).
      uint32_t pa[kBlockM / 16][4], da[kBlockM / 16][4];
      if constexpr (kMode != kDead) {
        // This thread's lse and dsum columns (queries 8 j + 2 (lane % 4) + x), read while the
        // products below run (dsum after the first wait, when the previous dK's A operand is free).
        float lse_r[kBlockM / 4], dsum_r[kBlockM / 4];
        auto read_cols = [&](const float* src, float (&dst)[kBlockM / 4]) {
#pragma unroll
          for (int j = 0; j < kBlockM / 8; ++j) {
            const float2 v =
                *reinterpret_cast<const float2*>(src + s * kBlockM + 8 * j + 2 * (lane & 3));
            dst[2 * j] = v.x, dst[2 * j + 1] = v.y;
          }
        };
        read_cols(sLse, lse_r);

        float st[kBlockM / 2], dpt[kBlockM / 2];  // S^T, dP^T: 64 keys x 64 queries
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk)
          if constexpr (kKVRegs)
            wgmma_m64n64k16_rs<0>(st, ka[kk], q_desc(sQ(s), kk), kk > 0);
          else
            wgmma_m64n64k16_ss(st, kv_desc(sK_t, kk), q_desc(sQ(s), kk), kk > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk)
          if constexpr (kKVRegs)
            wgmma_m64n64k16_rs<0>(dpt, va[kk], q_desc(sdO(s), kk), kk > 0);
          else
            wgmma_m64n64k16_ss(dpt, kv_desc(sV_t, kk), q_desc(sdO(s), kk), kk > 0);
        wgmma_commit();
        wgmma_wait<1>();  // S^T done; P^T is computed while dP^T runs
        reg_fence(st);
        release_held();  // the previous tile's dK retired with S^T
        read_cols(sDsum, dsum_r);

        // P^T (in place); the columns are queries m0 + 8 j + 2 (lane % 4) + x.
        const bool need_mask = m0 + kBlockM > L || n0 + kBlockN > L ||
                               (p.causal && n0 + kBlockN - 1 > m0) ||
                               (p.window > 0 && m0 + kBlockM - 1 - n0 >= p.window);
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const float l2 = lse_r[2 * j + x];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
              st[4 * j + 2 * hf + x] = ex2(fmaf(st[4 * j + 2 * hf + x], c, -l2));
          }
        if (need_mask) {  // apart from the exponentials, so the unmasked tiles run a straight line
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            // Key row n0 + key_row + 8 hf sees the tile's columns (queries m0 + col) in [lo, hi).
            const int key = n0 + key_row + 8 * hf;
            const int lo = key >= L ? kBlockM : p.causal ? key - m0 : 0;
            const int hi = p.window > 0 ? key - m0 + p.window : kBlockM;
#pragma unroll
            for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
              for (int x = 0; x < 2; ++x) {
                const int col = 8 * j + 2 * (lane & 3) + x;
                if (col < lo || col >= hi) st[4 * j + 2 * hf + x] = 0.f;
              }
          }
        }
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
          for (int q = 0; q < 4; ++q)
            pa[kk][q] = pack_bf16(st[8 * kk + 2 * q], st[8 * kk + 2 * q + 1]);
        // dV += P^T dO runs while dS^T is computed.
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          wgmma_rs(dv, pa[kk], smem_desc_sw128(sdO(s) + kk * 2048, kBlockM * 128));
        wgmma_commit();
        wgmma_wait<1>();  // dP^T done (dV may still run)
        reg_fence(dpt);
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const float ds = dsum_r[2 * j + x];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int e = 4 * j + 2 * hf + x;
              dpt[e] = st[e] * (dpt[e] - ds);
            }
          }
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
          for (int q = 0; q < 4; ++q)
            da[kk][q] = pack_bf16(dpt[8 * kk + 2 * q], dpt[8 * kk + 2 * q + 1]);
      } else {  // zeros for this warpgroup's dS^T rows, which dQ reads
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
          for (int q = 0; q < 4; ++q) da[kk][q] = 0u;
      }
      // dS^T into the shared tile: key row r, queries 8 j + 2 (lane % 4) .. + 1 (4 bytes of the
      // 16-byte chunk j, swizzled by the row).
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = key_row + 8 * (q & 1), j = 2 * kk + (q >> 1);
          const uint32_t addr = sdS + r * 128 + 16 * (j ^ (r & 7)) + 4 * (lane & 3);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(da[kk][q]) : "memory");
        }
      fence_proxy_async();  // the dS^T stores, visible to wgmma (the async proxy)
      if (tid == 0) bulk_wait_read();  // the previous tile's reduction has read the staging tile
      named_barrier_sync(1, 256);      // (a)

      // dQ of this tile, 64 queries x D / 2 columns per warpgroup over all 128 keys (D = 128: K
      // column block wg; D = 64: the 32 columns 64 wg bytes into K's rows). Then dK += dS^T Q;
      // the dQ staging below runs while dK is in flight.
      constexpr int kDqRegs = kDqCols / 2;
      float dq[kDqRegs];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kDqSteps; ++kk) {
        const uint32_t a = sdS + kk * 2048;
        if constexpr (kDqCols == 64) {
          wgmma_m64n64k16_ss_tt(dq, smem_desc_sw128(a, 16),
                                smem_desc_sw128(sK_t + wg * kBlockN * 128 + kk * 2048, 16), kk > 0);
        } else {  // D = 64: the warpgroup's 32 columns, 64 bytes into K's rows
          wgmma_m64n32k16_ss_tt(dq, smem_desc_sw128(a, 16),
                                smem_desc_sw128(sK_t + kk * 2048 + wg * 64, 16), kk > 0);
        }
      }
      wgmma_commit();
      if constexpr (kMode != kDead) {
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          wgmma_rs(dk, da[kk], smem_desc_sw128(sQ(s) + kk * 2048, kBlockM * 128));
        wgmma_commit();
        wgmma_wait<1>();  // dV and dQ retired
      } else {
        wgmma_wait<0>();  // dQ retired (no dV, no dK), and the previous tile's dK
        release_held();
      }
      reg_fence(dq);

      // dQ -> staging tile (dq_accum layout: row r = token m0 + r, chunk swizzled by the token).
      {
        const int col0 = wg * kDqCols;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = wq * 16 + (lane >> 2) + 8 * hf;
          const int64_t t = seq_begin + static_cast<int64_t>(m0) + r;
#pragma unroll
          for (int j = 0; j < kDqRegs / 4; ++j) {
            const int col = col0 + 8 * j + 2 * (lane & 3);
            st_shared_f32x2(sdQ + 4 * (r * kD + dq_row_offset(t, col)), dq[4 * j + 2 * hf],
                            dq[4 * j + 2 * hf + 1]);
          }
        }
        fence_proxy_async();
      }
      named_barrier_sync(1, 256);  // (d) staging complete; every dQ product of the tile retired
      if (tid == 0) {
        const int rows = min(kBlockM, L - m0);
        float* dst = p.dq_accum + (int64_t{h} * p.num_tokens + seq_begin + m0) * kD;
        bulk_reduce_add_f32(dst, sdQ, static_cast<uint32_t>(rows * kD * 4));
        bulk_commit();
      }
      if constexpr (kMode != kDead) {
        held = s;  // dK still reads Q of stage s: released when the next wait retires it
      } else {
        if (leader) mbar_arrive(q_empty(s));
      }
    };
    for (int it = 0, h = kv * G, mt = 0; it < n_iter; ++it, ++qt, next_q_tile(h, mt, tiles)) {
      const int s = qt % kStages;
      const int m0 = b.m_begin + mt * kBlockM;
      mbar_wait(q_full(s), (qt / kStages) & 1);
      bool dead = false;
      if constexpr (kD == 64)
        dead = __all_sync(0xffffffffu, wg == 1 && (n0 + 64 >= L || (p.causal && n0 >= m0)));
      if (dead)
        q_tile(s, h, m0, std::integral_constant<int, kDead>{});
      else
        q_tile(s, h, m0, std::integral_constant<int, kFull>{});
    }
    wgmma_wait<0>();  // the last dK
    reg_fence(dv);
    reg_fence(dk);
    release_held();
    if (leader) mbar_arrive(kv_empty(t));  // every product reading K and V of the item retired

    // dK = scale dS^T Q and dV, rows inside the sequence (8-byte stores, store_row_pairs).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = n0 + key_row + 8 * hf;
      bf16* dk_row = p.dk + (seq_begin + static_cast<int64_t>(min(key, L - 1))) * p.q_row + kv * kD;
      bf16* dv_row = dk_row + Hkv * kD;
      store_row_pairs<kD / 8>(dk_row, key < L, lane, [&](int j) {
        return pack_bf16(dk[4 * j + 2 * hf] * p.scale, dk[4 * j + 2 * hf + 1] * p.scale);
      });
      store_row_pairs<kD / 8>(dv_row, key < L, lane,
                              [&](int j) { return pack_bf16(dv[4 * j + 2 * hf], dv[4 * j + 2 * hf + 1]); });
    }
  }
  if (tid == 0) bulk_wait();  // the last reduction done before the block's shared memory goes
#endif  // ENGINE_SM90A
}

template <int kD>
bool kernel_ready() {
  static const bool ok = [] {
    if (!sm90::sm90_kernel_runs(reinterpret_cast<const void*>(flash_bwd_sm90_kernel<kD>)) ||
        sm90::tensor_map_encoder() == nullptr)
      return false;
    CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_sm90_kernel<kD>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(BwdSm90Config<kD>::kSmemBytes)));
    return true;
  }();
  return ok;
}

template <int kD>
void launch(const Params& p, const Grid& g, cudaStream_t stream) {
  using C = BwdSm90Config<kD>;
  const char* op = "attention_backward (sm90)";
  const CUtensorMap map_qkv = column_block_map(p.q, p.q_row, p.num_tokens, 64, op);
  const CUtensorMap map_do =
      column_block_map(p.dout, int64_t{p.num_heads} * kD, p.num_tokens, 64, op);
  // Launch order as run_flash_bwd: sections of (kv head, sequence) pairs whose q, dO and dQ
  // rows take about 24 MB.
  const int64_t pair_bytes = int64_t{g.max_seqlen_q} * (p.num_heads / p.num_kv_heads) * kD * 8;
  const int64_t pairs = int64_t{p.num_kv_heads} * g.num_seqs;
  int64_t section = 1;
  while (section * 2 * pair_bytes <= (int64_t{24} << 20) && section < pairs) section *= 2;
  BwdSm90Params kp{};
  kp.lse = p.lse;
  kp.dsum = p.dsum;
  kp.dq_accum = p.dq_accum;
  kp.dk = p.dk;
  kp.cu_seqlens = p.cu_seqlens_q;
  kp.num_tokens = p.num_tokens;
  kp.q_row = p.q_row;
  kp.num_heads = p.num_heads;
  kp.num_kv_heads = p.num_kv_heads;
  kp.scale = p.scale;
  kp.window = p.window;
  kp.bwd_section = static_cast<int>(section);
  // hd128: the last four sections as one (bwd_block), faster for GQA and packed documents; hd64
  // keeps one, slower with four (docs/PERF.md).
  kp.bwd_tail = kD == 128 ? 4 : 1;
  kp.n_blocks = static_cast<int>(ceil_div(g.max_seqlen_k, C::kBlockN));
  kp.num_seqs = g.num_seqs;
  kp.items = int64_t{kp.n_blocks} * p.num_kv_heads * g.num_seqs;
  kp.causal = p.causal;
  ENSURE(kp.items <= std::numeric_limits<int32_t>::max(), op, ": ", kp.items, " key tiles");
  const int64_t blocks = std::min<int64_t>(kp.items, sm90_sm_count());
  Buffer next_item(sizeof(int), Device::CUDA);  // back to the caching allocator on return:
  kp.next_item = static_cast<int*>(next_item.data());  // its later users follow on the stream
  CUDA_CHECK(cudaMemsetAsync(kp.next_item, 0, sizeof(int), stream));
  flash_bwd_sm90_kernel<kD>
      <<<static_cast<unsigned>(blocks), C::kThreads, C::kSmemBytes, stream>>>(map_qkv, map_do,
                                                                              kp);
  check_launch("flash_bwd_sm90_kernel");
}

}  // namespace

bool flash_bwd_sm90_available(int head_dim) {
  if (head_dim == 64) return kernel_ready<64>();
  if (head_dim == 128) return kernel_ready<128>();
  return false;
}

bool flash_bwd_sm90_eligible(const Params& p, const Grid& g) {
  return (p.head_dim == 64 || p.head_dim == 128) && p.k == p.q + p.num_heads * p.head_dim &&
         p.kv_row == p.q_row && p.cu_seqlens_k == p.cu_seqlens_q &&
         p.dk == p.dq + p.num_heads * p.head_dim && reinterpret_cast<uintptr_t>(p.q) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.dout) % 16 == 0 && flash_bwd_sm90_available(p.head_dim);
}

void run_flash_bwd_sm90(const Params& p, const Grid& g, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch<64>(p, g, stream);
  else
    launch<128>(p, g, stream);
}

}  // namespace engine::cuda::flash
