// The grouped GEMMs on Hopper's wgmma (sm_90a), the contract of grouped_gemm.cu (whose mma.sync
// kernels are the portable path). Two kernels:
//   - the persistent, clustered TMA kernel (here: forward, input gradient, weight gradient), and
//   - the cp.async forward kernel (grouped_gemm_sm90_cp_async.cu), the forward of the weight
//     stacks the TMA kernel's 64-row weight boxes cannot take (S > 1 with N/S % 64 != 0).
// The tile shape, stage ring and wgmma helpers they share: grouped_gemm_sm90.cuh; the TMA
// kernel's tensor maps, shape rules and entry points: grouped_gemm_sm90_launch.cu (this file: the
// kernel and its launch).
#include <algorithm>

#include "cuda/common/launch.cuh"
#include "cuda/common/sm90.cuh"
#include "cuda/moe/grouped_gemm_common.cuh"
#include "cuda/moe/grouped_gemm_sm90.cuh"

namespace engine::cuda::grouped {
namespace {

using namespace wgmma_detail;

#ifdef MOE_WGMMA
// ---- mbarriers and the tensor memory accelerator (TMA): cuda/common/sm90.cuh -------------------
using sm90::mbar_arrive;
using sm90::mbar_expect_tx;
using sm90::mbar_init;
using sm90::mbar_wait;
using sm90::tma_load_2d;
using sm90::tma_load_3d;
#endif  // MOE_WGMMA

// ---- The persistent, clustered TMA kernel (forward, input gradient, weight gradient) ----------
// One kernel for the three products, C (M x N tile of 128 x 256) = A B^T reduced in k steps of
// 64, the tile and wgmma of the cp.async kernel, operands by TMA in the 128-byte swizzle:
//   forward  y = x W_e^T     A = x rows (K-major),       B = W_e rows n (K-major)
//   dgrad    dx = dy W_e     A = dy rows (K-major),      B = W_e read MN-major (rows n of W_e are
//                            the reduction, their 64-element runs along k the output columns)
//   wgrad    dW_e += dy_e^T x_e   A = dy_e MN-major (token rows are the reduction, 64 n per
//                            run), B = x_e MN-major; reduction over the expert's rows only
// wgmma reads MN-major operands through its transpose bits, so no transposed copies are made.
// Block: warps 0-7 two consumer warpgroups (64 x 256 each, 128 f32 accumulators per thread, 224
// registers by setmaxnreg), warps 8-11 the producer warpgroup (56 registers; one thread issues
// every copy, its box coordinates computed once per unit: a 64-bit division per box and step held
// the forward back, docs/PERF.md). 4-stage ring, stage s = A (two 64-row boxes or one 128-row box,
// 16 KiB) + B (four 64-row boxes, 32 KiB); barriers full[s] (the producer's expect_tx; completes
// when the stage's 48 KiB have landed) and empty[s] (4 arrivals: both consumer warpgroups of both
// CTAs of the cluster, once their wgmma reading the stage retired: each warpgroup waits for its
// step's wgmma and releases the stage at once, the other warpgroup's wgmma keeping the tensor cores
// busy meanwhile; faster on H200 than keeping one step in flight, docs/PERF.md).
// Cluster of 2 CTAs on adjacent 128-row tiles of the same 256 columns (a "unit"): they need the
// same B tile, so each loads half of it (two boxes) and multicasts it into both CTAs' stages,
// halving the B traffic from L2 (the kernels without it were bound by the L2 -> SM reads,
// docs/PERF.md). Where the two row tiles belong to different experts (forward, dgrad: an expert
// with an odd number of tiles) each CTA loads its whole B itself for that unit. Both CTAs walk the
// same units with the same k steps, so stage and phase counters agree; a CTA whose tile is past the
// rows (odd tile counts, the static bound) computes it and stores nothing.
// Persistent grid: as many clusters as fit at once, cluster c takes units c, c + clusters, ...;
// the producer runs on into the next unit's loads while the consumers store the last one.
// Units: forward / dgrad, 256-row pairs x 256 output columns in groups of kRasterGroup pairs with
// the column outer (raster, L2 reuse); wgrad, (expert, pair of 128-row tiles of N, 256 columns of
// K), experts with no rows skipped. Where E <= kTableMax the block copies the expert offsets and
// counts into shared memory first, so the unit lookups (the forward / dgrad tile -> expert binary
// search, the wgrad expert's rows), which the consumers make between two units with the tensor
// cores idle, read no global memory. Rows past an expert's count: forward / dgrad, loaded (another
// expert's or padding) and never stored; wgrad, the last k step's token rows past the count are
// zeroed in shared memory (both operands) before its wgmma. Rows and columns past the tensors are
// TMA zero fill. Epilogues through a 16 KiB shared buffer per warpgroup: bf16 stores of 16-byte
// chunks per thread (forward, dgrad; TMA stores were no faster, docs/PERF.md), and the weight
// gradient's dW += by TMA reductions (the copy engine adds each 64 x 32 f32 box in L2,
// asynchronously; each dW tile by one CTA, deterministic; see epilogue_f32_tma) where dW is 16-byte
// aligned, each warpgroup's 64 rows lie in one stack and the expert has at least kTmaEpiMinSteps k
// steps, else the threads' read-modify-write (old values loaded together, then stored).
constexpr int kTmaThreads = 384;  // 2 consumer warpgroups + 1 producer warpgroup
// Registers per thread after setmaxnreg (the block is compiled for 65536 / 384 = 168).
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
static_assert(sm90::setmaxnreg_fits(kTmaThreads, kProducerRegs + 2 * kConsumerRegs), "register file");
constexpr uint32_t kBoxBytes = kBox * kBK * 2;
constexpr uint32_t kEpiBytes = 64 * 256;  // epilogue staging per consumer warpgroup
// After the stages: the epilogue's staging (1024-byte aligned: the TMA epilogue's swizzle
// follows the address bits), the barriers (full[s], empty[s]: 8 bytes each), the expert table.
constexpr uint32_t kEpiOffset = kStages * kStageBytes;
constexpr uint32_t kBarOffset = kEpiOffset + 2 * kEpiBytes;
static_assert(kEpiOffset % 1024 == 0 && kEpiBytes % 1024 == 0, "staging alignment");
// The expert table (offsets, counts) in shared memory when E <= kTableMax (the unit lookups'
// binary search then reads no global memory).
constexpr int kTableMax = 64;
constexpr uint32_t kTableOffset = kBarOffset + 16 * kStages;
constexpr uint32_t kTableBytes = (2 * kTableMax + 1) * 4 + 12;
constexpr size_t kTmaSmemBytes = size_t{kTableOffset} + kTableBytes + 1024;  // + alignment slack
// 227 KiB per block, less the 1 KiB the compiler lists as the kernels' static shared memory.
static_assert(kTmaSmemBytes + 1024 <= 232448, "shared memory per block");
static_assert(kATileBytes == 2 * kBoxBytes && kBTileBytes == 4 * kBoxBytes, "boxes per tile");
// Pairs of row tiles per raster group (other group sizes were no faster, docs/PERF.md).
constexpr int kRasterGroup = 4;

struct Unit {
  int e;
  int m0, n0;          // this CTA's tile: first row (forward / dgrad: of R; wgrad: of N), column
  int64_t rows_valid;  // forward / dgrad: rows of the tile its expert owns; wgrad: N - m0
  int nk;              // k steps
  int t0, count;       // wgrad: the expert's first row and row count
  bool mcast, skip;
};

template <int kMode>
__device__ __forceinline__ Unit unit_of(const TmaParams& p, const int32_t* offs, const int32_t* cnts,
                                        int u, int rank) {
  Unit w;
  int pm, tn;
  if constexpr (kMode == kWgrad) {
    const int per_e = p.pairs_m * p.tiles_n;
    w.e = u / per_e;
    raster(u - w.e * per_e, p.group, p.pairs_m, p.tiles_n, pm, tn);
    w.count = cnts[w.e];
    w.t0 = offs[w.e];
    w.skip = w.count <= 0;
    w.mcast = true;  // both row tiles reduce over the same expert's token rows
    w.m0 = (2 * pm + rank) * kBM;
    w.rows_valid = p.m_rows - w.m0;
    w.nk = (w.count + kBK - 1) / kBK;
  } else {
    raster(u, p.group, p.pairs_m, p.tiles_n, pm, tn);
    const int64_t r0 = int64_t{2 * pm} * kBM;
    const TileExpert a = tile_expert(offs, cnts, p.experts, r0);
    const TileExpert b = tile_expert(offs, cnts, p.experts, r0 + kBM);
    const TileExpert& mine = rank ? b : a;
    w.e = mine.e;
    w.rows_valid = mine.rows_valid;
    w.skip = a.rows_valid <= 0 && b.rows_valid <= 0;
    w.mcast = a.rows_valid > 0 && b.rows_valid > 0 && a.e == b.e;
    w.m0 = static_cast<int>(r0) + rank * kBM;
    w.nk = static_cast<int>((p.red + kBK - 1) / kBK);
    w.t0 = w.count = 0;
  }
  w.n0 = tn * kBN;
  return w;
}

#ifdef MOE_WGMMA
// The epilogue through shared memory: warpgroup wg's 64 x 256 accumulators (thread t of the
// group: rows 16 (t / 32) + (t % 32) / 4 and + 8, columns 8 j + 2 (t % 4) and + 1 of every n8
// block j) go out in rounds of 256 bytes per row (bf16: 128 columns, 2 rounds; f32: 64 columns,
// 4 rounds) through the warpgroup's 16 KiB buffer, row r at 256 r bytes, its 16-byte chunk c at
// c ^ (r % 8) (conflict-free writes and reads); then each thread moves 16-byte chunks, a warp
// covering two rows of 256 contiguous bytes of the output.
__device__ __forceinline__ void epi_sync(int wg) { sm90::named_barrier_sync(2 + wg, 128); }

// bf16 y (rows below rows_valid, columns below ld) of the warpgroup's 64 x 256 block at (m0, n0).
__device__ __forceinline__ void epilogue_bf16(const float (&acc)[128], uint32_t buf, int wg, int t,
                                              gbf16* y, int64_t ld, int64_t m0, int64_t n0,
                                              int64_t rows_valid) {
  const int lane = t & 31, r0 = (t >> 5) * 16 + (lane >> 2);
  const int rr = t >> 4, c = t & 15;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int jj = 0; jj < 16; ++jj)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = r0 + 8 * half, j = 16 * h + jj;
        const uint32_t addr = buf + r * 256 + 16 * (jj ^ (r & 7)) + 4 * (lane & 3);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr),
                     "r"(flash::pack_bf16(acc[j * 4 + 2 * half], acc[j * 4 + 2 * half + 1]))
                     : "memory");
      }
    epi_sync(wg);
    const int64_t col = n0 + 128 * h + 8 * c;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = rr + 8 * i;
      uint32_t v0, v1, v2, v3;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                   : "r"(buf + r * 256 + 16 * (c ^ (r & 7)))
                   : "memory");
      if (r < rows_valid && col < ld)
        *reinterpret_cast<uint4*>(y + (m0 + r) * ld + col) = make_uint4(v0, v1, v2, v3);
    }
    epi_sync(wg);  // the buffer is read before the next round overwrites it
  }
}

// f32 dW += the warpgroup's 64 x 256 block at (m0 of N, n0 of K), rows below `rows`, columns
// below `cols`;
// each thread loads its old values before adding (the loads in flight together).
__device__ __forceinline__ void epilogue_f32_add(const float (&acc)[128], uint32_t buf, int wg, int t,
                                                 const RowMatrix<float>& dw, int64_t rows, int64_t cols,
                                                 int64_t m0, int64_t n0) {
  const int lane = t & 31, r0 = (t >> 5) * 16 + (lane >> 2);
  const int rr = t >> 4, c = t & 15;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = r0 + 8 * half, j = 8 * q + jj;
        const int chunk = 2 * jj + ((lane & 3) >> 1);
        const uint32_t addr = buf + r * 256 + 16 * (chunk ^ (r & 7)) + 8 * (lane & 1);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(acc[j * 4 + 2 * half]),
                     "f"(acc[j * 4 + 2 * half + 1])
                     : "memory");
      }
    epi_sync(wg);
    const int64_t col = n0 + 64 * q + 4 * c;
    {
      constexpr int b = 0;
      float4 old[8];
      float* dst[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = rr + 8 * (8 * b + i);
        const bool ok = m0 + r < rows && col < cols;
        dst[i] = ok ? dw.row(m0 + r) + col : nullptr;
        if (ok) {
          const float2 lo = *reinterpret_cast<const float2*>(dst[i]);
          const float2 hi = *reinterpret_cast<const float2*>(dst[i] + 2);
          old[i] = make_float4(lo.x, lo.y, hi.x, hi.y);
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = rr + 8 * (8 * b + i);
        float4 v;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(buf + r * 256 + 16 * (c ^ (r & 7)))
                     : "memory");
        if (dst[i] != nullptr) {
          *reinterpret_cast<float2*>(dst[i]) = make_float2(old[i].x + v.x, old[i].y + v.y);
          *reinterpret_cast<float2*>(dst[i] + 2) = make_float2(old[i].z + v.z, old[i].w + v.w);
        }
      }
    }
    epi_sync(wg);
  }
}

// ---- The weight gradient's epilogue by TMA reductions: the copy engine adds (f32, in L2) boxes of
// the staging buffer into dW, asynchronously, so the consumers go on to the next unit's k steps
// instead of waiting for dW's old values (faster on the balanced weight gradient, docs/PERF.md).
// The warpgroup's 16 KiB buffer is two 8 KiB slots, box b (64 rows x 32 columns, 128-byte rows)
// staged in slot b % 2 in the 128-byte swizzle of dW's tensor map (row r at 128 r bytes, 16-byte
// chunk c at c ^ (r % 8): conflict-free writes of the accumulator fragment); every thread fences
// its writes to the async proxy, the leader thread, before the barrier that lets the threads write
// the next box, waits until the copy before it has read its slot (cp.async.bulk.wait_group.read),
// and after it issues the box's reduction. A unit's last copy is waited for by the next unit's
// first barrier (or the kernel's end). Each element of dW gets one add per call (each tile by one
// CTA): deterministic, and the same round-to-nearest f32 sum old + acc as the threads'
// read-modify-write (subnormals aside: the copy engine's add may flush them).
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                                  int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The TMA reductions for units of at least this many k steps (an expert's rows / 64); shorter
// units take the threads' read-modify-write. Where every unit is short, the units' dW traffic
// outruns the copy engine's f32 adds (slower than the threads on 64 experts x 80 rows,
// docs/PERF.md); the threshold is where the two epilogues' costs per unit break even.
constexpr int kTmaEpiMinSteps = 12;

// f32 dW += the warpgroup's 64 x 256 block: rows from c1 of stack-expert c2 (dW's map (K, N/S,
// S E); rows past N/S clipped), columns n0 .. (past K clipped), as eight 32-column boxes.
__device__ __forceinline__ void epilogue_f32_tma(const float (&acc)[128], uint32_t buf, int wg, int t,
                                                 bool leader, const CUtensorMap* map, int64_t cols,
                                                 int c1, int c2, int n0) {
  const int lane = t & 31, r0 = (t >> 5) * 16 + (lane >> 2);
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const uint32_t slot = buf + (b & 1) * (kEpiBytes / 2);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = r0 + 8 * hf, j = 4 * b + jj;
        const int chunk = 2 * jj + ((lane & 3) >> 1);  // columns 8 jj + 2 (lane % 4), + 1
        const uint32_t addr = slot + r * 128 + 16 * (chunk ^ (r & 7)) + 8 * (lane & 1);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(acc[j * 4 + 2 * hf]),
                     "f"(acc[j * 4 + 2 * hf + 1])
                     : "memory");
      }
    flash::fence_proxy_async();
    if (leader) flash::bulk_wait_read();  // box b - 1 has left the other slot
    epi_sync(wg);
    if (leader && n0 + 32 * b < cols) {
      tma_reduce_add_3d(map, slot, n0 + 32 * b, c1, c2);
      flash::bulk_commit();
    }
  }
}
#endif  // MOE_WGMMA

template <int kMode>
static __global__ void ENGINE_CLUSTER_DIMS(2, 1, 1) __launch_bounds__(kTmaThreads, 1)
    grouped_tma_kernel(const __grid_constant__ CUtensorMap map_a,
                       const __grid_constant__ CUtensorMap map_b,
                       const __grid_constant__ CUtensorMap map_c, const TmaParams p) {
#ifdef MOE_WGMMA
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (flash::smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t full0 = base + kBarOffset, empty0 = full0 + kStages * 8;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int rank = static_cast<int>(sm90::cluster_ctarank());
  const int cluster = blockIdx.x / 2, clusters = gridDim.x / 2;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 4);
    }
    sm90::mbar_init_fence();
  }
  const int32_t* offs = p.offsets;
  const int32_t* cnts = p.counts;
  if (p.experts <= kTableMax) {
    int32_t* t = reinterpret_cast<int32_t*>(smem_raw + (base - flash::smem_u32(smem_raw)) + kTableOffset);
    for (int i = tid; i <= p.experts; i += kTmaThreads) t[i] = p.offsets[i];
    for (int i = tid; i < p.experts; i += kTmaThreads) t[kTableMax + 1 + i] = p.counts[i];
    offs = t;
    cnts = t + kTableMax + 1;
  }
  sm90::cluster_sync();  // the peer's barriers are initialised before any multicast or arrival

  if (warp >= 8) {  // producer warpgroup: warp 8, lane 0 issues every copy
    sm90::setmaxnreg_dec<kProducerRegs>();
    if (tid == 256) {
      int it = 0;  // k steps of this CTA so far (stage it % kStages)
      for (int u = cluster; u < p.units; u += clusters) {
        const Unit w = unit_of<kMode>(p, offs, cnts, u, rank);
        if (w.skip) continue;
        const uint16_t mask = 3;
        const int q0 = w.mcast ? 2 * rank : 0, q1 = w.mcast ? q0 + 2 : 4;
        // Forward: the weight-row coordinates (row in stack, stack x E + e) of the B boxes, per
        // unit (no divisions in the k loop).
        int bc1[4] = {0, 0, 0, 0}, bc2[4] = {0, 0, 0, 0};
        if constexpr (kMode == kFwd) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int64_t n = int64_t{w.n0} + q * kBox, st = n / p.n_per_stack;
            bc1[q] = static_cast<int>(n - st * p.n_per_stack);
            bc2[q] = static_cast<int>(st * p.experts + w.e);
          }
        }
        const int nps = static_cast<int>(p.n_per_stack);
        for (int kt = 0; kt < w.nk; ++kt, ++it) {
          const int s = it % kStages;
          if (it >= kStages) mbar_wait(empty0 + 8 * s, ((it / kStages) - 1) & 1);
          const uint32_t stage = base + s * kStageBytes, full = full0 + 8 * s;
          mbar_expect_tx(full, kStageBytes);
          const int k0 = kt * kBK;
          if constexpr (kMode == kWgrad) {
            tma_load_2d(stage, &map_a, w.m0, w.t0 + k0, full);
            tma_load_2d(stage + kBoxBytes, &map_a, w.m0 + kBox, w.t0 + k0, full);
          } else {
            tma_load_2d(stage, &map_a, k0, w.m0, full);
          }
          // dgrad: the 64 weight rows k0 .. (the reduction) lie in one stack.
          const int dst_stack = kMode == kDgrad ? k0 / nps : 0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (q < q0 || q >= q1) continue;
            const uint32_t dst = stage + kATileBytes + q * kBoxBytes;
            if constexpr (kMode == kWgrad) {
              sm90::tma_load_2d_multicast(dst, &map_b, w.n0 + q * kBox, w.t0 + k0, full, mask);
            } else {
              // forward: box (64 of k, 64 weight rows n0 + 64 q); dgrad: box (64 output columns
              // n0 + 64 q along k, 64 weight rows k0 = the reduction).
              const int c0 = kMode == kFwd ? k0 : w.n0 + q * kBox;
              const int c1 = kMode == kFwd ? bc1[q] : k0 - dst_stack * nps;
              const int c2 = kMode == kFwd ? bc2[q] : dst_stack * p.experts + w.e;
              if (w.mcast) sm90::tma_load_3d_multicast(dst, &map_b, c0, c1, c2, full, mask);
              else tma_load_3d(dst, &map_b, c0, c1, c2, full);
            }
          }
        }
      }
    }
  } else {
    sm90::setmaxnreg_inc<kConsumerRegs>();
    const int wg = warp >> 2;
    const bool leader = (tid & 127) == 0;
    const uint32_t peer_empty0 = sm90::mapa_shared(empty0, static_cast<uint32_t>(rank ^ 1));
    // The stage of step j goes back to both producers.
    auto release = [&](int j) {
      if (leader) {
        const int s = j % kStages;
        mbar_arrive(empty0 + 8 * s);
        sm90::mbar_arrive_cluster(peer_empty0 + 8 * s);
      }
    };
    constexpr int kTA = kMode == kWgrad ? 1 : 0, kTB = kMode == kFwd ? 0 : 1;
    // Descriptor steps per k16: K-major +32 bytes, MN-major +2048 bytes (16 rows of 128).
    constexpr uint64_t kStepA = kTA ? 2048 >> 4 : 32 >> 4, kStepB = kTB ? 2048 >> 4 : 32 >> 4;
    int it = 0;
    float acc[128];
    for (int u = cluster; u < p.units; u += clusters) {
      const Unit w = unit_of<kMode>(p, offs, cnts, u, rank);
      if (w.skip) continue;
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.f;
      reg_fence(acc);
      for (int kt = 0; kt < w.nk; ++kt, ++it) {
        const int s = it % kStages;
        mbar_wait(full0 + 8 * s, (it / kStages) & 1);
        const uint32_t stage = base + s * kStageBytes;
        if constexpr (kMode == kWgrad) {
          const int valid = w.count - kt * kBK;  // token rows of this step inside the expert
          if (valid < kBK) {  // zero the rest in all six boxes (whole 128-byte rows: swizzle-free)
            const int bad = kBK - valid;
            for (int i = tid; i < 6 * bad * 8; i += 256) {
              const int box = i / (bad * 8), r = valid + (i / 8) % bad, c = i % 8;
              const uint32_t addr = stage + box * kBoxBytes + r * 128 + c * 16;
              asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
            }
            flash::fence_proxy_async();
            sm90::named_barrier_sync(1, 256);
          }
        }
        const uint64_t da = kTA ? sm90::smem_desc_sw128(stage + wg * kBoxBytes, 16)
                                : sm90::smem_desc_sw128(stage + wg * 64 * 128, 16);
        const uint64_t db = sm90::smem_desc_sw128(stage + kATileBytes, kTB ? kBoxBytes : 16);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16_tt<kTA, kTB>(acc, da + kk * kStepA, db + kk * kStepB);
        wgmma_commit();
        wgmma_wait<0>();  // this step has retired: its stage goes back at once
        release(it);
      }
      wgmma_wait<0>();
      reg_fence(acc);
      const uint32_t buf = base + kEpiOffset + wg * kEpiBytes;
      const int64_t wg_row = int64_t{w.m0} + 64 * wg;  // the warpgroup's first row of the tile
      if constexpr (kMode == kWgrad) {
        if (p.tma_epi && w.nk >= kTmaEpiMinSteps) {
          if (wg_row < p.m_rows) {  // rows of dW (one stack: N/S % 64 == 0 where S > 1)
            const int st = p.stacks > 1 ? static_cast<int>(wg_row / p.n_per_stack) : 0;
            epilogue_f32_tma(acc, buf, wg, tid & 127, leader, &map_c, p.out_cols,
                             static_cast<int>(wg_row - int64_t{st} * p.n_per_stack),
                             st * p.experts + w.e, w.n0);
          }
        } else {
          if (p.tma_epi) {  // the buffer's last reduction has read it before the threads reuse it
            if (leader) flash::bulk_wait_read();
            epi_sync(wg);
          }
          epilogue_f32_add(acc, buf, wg, tid & 127,
                           expert_weight(static_cast<float*>(p.out), w.e, p.experts, p.n_per_stack,
                                         p.out_cols, p.stacks),
                           p.m_rows, p.out_cols, wg_row, w.n0);
        }
      } else {
        epilogue_bf16(acc, buf, wg, tid & 127, static_cast<gbf16*>(p.out), p.out_cols, wg_row, w.n0,
                      w.rows_valid - 64 * wg);
      }
    }
    if (p.tma_epi && leader) flash::bulk_wait();  // the copies are done before the block leaves
  }
  sm90::cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
#endif
}

// The persistent launch: as many 2-CTA clusters as are resident at once (queried once per
// kernel), at most one per unit.
template <int kMode>
void launch_mode(const CUtensorMap& ma, const CUtensorMap& mb, const CUtensorMap& mc, bool tma_epi,
                 TmaParams p, const char* name) {
  // A group taller than the pairs of row tiles maps the units as one of exactly that height does.
  p.group = std::min(kRasterGroup, std::max(1, p.pairs_m));
  p.tma_epi = tma_epi;
  static const int slots = [] {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(std::max(2, sms / 2 * 2)));
    cfg.blockDim = dim3(kTmaThreads);
    cfg.dynamicSmemBytes = kTmaSmemBytes;
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, grouped_tma_kernel<kMode>, &cfg));
    ENSURE(n > 0, "grouped linear: no 2-CTA cluster of the TMA kernel fits on this device");
    return n;
  }();
  if (p.units <= 0) return;
  const unsigned grid = 2u * static_cast<unsigned>(std::min(slots, p.units));
  grouped_tma_kernel<kMode><<<grid, kTmaThreads, kTmaSmemBytes, stream()>>>(ma, mb, mc, p);
  check_launch(name);
}

}  // namespace

namespace wgmma_detail {

void tma_allow_smem() {
  for (const void* k : {reinterpret_cast<const void*>(grouped_tma_kernel<kFwd>),
                        reinterpret_cast<const void*>(grouped_tma_kernel<kDgrad>),
                        reinterpret_cast<const void*>(grouped_tma_kernel<kWgrad>)})
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kTmaSmemBytes)));
}

void launch_tma(Mode mode, const CUtensorMap& ma, const CUtensorMap& mb, const CUtensorMap& mc,
                bool tma_epi, const TmaParams& p) {
  switch (mode) {
    case kFwd: return launch_mode<kFwd>(ma, mb, mc, tma_epi, p, "grouped_tma_kernel<forward>");
    case kDgrad: return launch_mode<kDgrad>(ma, mb, mc, tma_epi, p, "grouped_tma_kernel<dgrad>");
    case kWgrad: return launch_mode<kWgrad>(ma, mb, mc, tma_epi, p, "grouped_tma_kernel<wgrad>");
  }
}

}  // namespace wgmma_detail
}  // namespace engine::cuda::grouped
