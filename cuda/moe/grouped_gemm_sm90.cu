// The forward grouped GEMM on Hopper's wgmma (sm_90a): y_rows(e) = x_rows(e) W_e^T, the same
// contract and tile scheduling as grouped_gemm.cu's mma.sync kernel (which runs where this one is
// not built, and for the two backward products).
// Block: 128 x 256 output tile, two consumer warpgroups of 64 x 256 each (wgmma m64n256k16,
// 128 f32 accumulators per thread), k steps of 64. All 256 threads stream A (128 x 64) and B
// (256 x 64) with cp.async into a 4-stage ring of 48 KiB stages, each operand tile in the
// 128-byte swizzled K-major layout wgmma reads through a matrix descriptor (grouped_gemm_common.cuh
// load_tile<.., 64, ..>: row r at 128 r bytes, 16-byte chunk c at c ^ (r % 8); stage bases
// 1024-byte aligned; descriptor stride between 8-row groups 1024 bytes, 128-byte swizzle mode; a
// k16 step advances the start address by 32 bytes). Per k step:
//   wait for the step's copies, fence them to the async proxy, barrier (also: both warpgroups
//   have retired the wgmma of step kt - 2, whose stage the next copies overwrite), issue the
//   copies of step kt + 2, then 4 wgmma on stage kt, commit, and wait until at most one group
//   (this step's) is in flight.
// Rows past the expert's count are zero-filled and never stored; columns past N likewise.
#include <cstdlib>
#include <cstring>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/sm90.cuh"
#include "cuda/moe/grouped_gemm_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_WGMMA 1
#endif

namespace engine::cuda::grouped {
namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64;
constexpr int kThreads = 256;
constexpr int kStages = 4, kAhead = kStages - 2;
constexpr uint32_t kATileBytes = kBM * kBK * 2, kBTileBytes = kBN * kBK * 2;
constexpr uint32_t kStageBytes = kATileBytes + kBTileBytes;
constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes + 1024;  // + alignment slack
static_assert(kBM == ops::kMoeRowAlign, "one row tile must never hold two experts");

#ifdef MOE_WGMMA
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::wgmma_wait;

// Shared-memory matrix descriptor: 128-byte swizzle, 1024 bytes between 8-row groups.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) { return sm90::smem_desc_sw128(addr, 16); }

// Keeps the compiler from moving accumulator reads / writes across the asynchronous wgmma.
__device__ __forceinline__ void acc_fence(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 256 f32, the wgmma accumulator fragment) += A (64 x 16, descriptor a) B (16 x 256,
// descriptor b)^T, both K-major in shared memory; scale-d = 1 (accumulate).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}

// The 128 x 256 tile of y held by the two consumer warpgroups (warpgroup wg: rows 64 wg ..;
// its thread `tid` (mod 128) the wgmma fragment of 16 rows per warp, 2 columns per n8 block):
// rows below rows_valid and columns below n stored as bf16 pairs.
__device__ __forceinline__ void store_tile(const float (&acc)[128], gbf16* y, int64_t n,
                                           int64_t row0, int64_t n0, int64_t rows_valid, int wg,
                                           int tid) {
  const int lane = tid & 31, warp = (tid >> 5) & 3;
  const int r = wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int64_t c = n0 + j * 8 + 2 * (lane & 3);
    if (c >= n) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int rr = r + 8 * half;
      if (rr < rows_valid)
        *reinterpret_cast<uint32_t*>(y + (row0 + rr) * n + c) =
            flash::pack_bf16(acc[j * 4 + 2 * half], acc[j * 4 + 2 * half + 1]);
    }
  }
}

// ---- mbarriers and the tensor memory accelerator (TMA): cuda/common/sm90.cuh -------------------
using sm90::mbar_arrive;
using sm90::mbar_expect_tx;
using sm90::mbar_init;
using sm90::mbar_wait;
using sm90::tma_load_2d;
using sm90::tma_load_3d;
#endif  // MOE_WGMMA

struct FwdParams {
  ForwardArgs a;
  int tiles_m, tiles_n;
};

static __global__ void __launch_bounds__(kThreads, 1) forward_wgmma_kernel(const FwdParams p) {
#ifdef MOE_WGMMA
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (flash::smem_u32(smem_raw) + 1023u) & ~1023u;
  int tm, tn;
  raster<8>(blockIdx.x, p.tiles_m, p.tiles_n, tm, tn);
  const int64_t row0 = int64_t{tm} * kBM;
  const TileExpert te = tile_expert(p.a.offsets, p.a.counts, p.a.experts, row0);
  if (te.rows_valid <= 0) return;
  const int64_t n0 = int64_t{tn} * kBN;
  const int tid = threadIdx.x, wg = tid >> 7;
  const RowMatrix<const gbf16> A = RowMatrix<const gbf16>{p.a.x, p.a.k, 0, 0}.from(row0, kBM);
  const RowMatrix<const gbf16> W =
      expert_weight(p.a.w, te.e, p.a.experts, p.a.n_per_stack, p.a.k, p.a.stacks).from(n0, kBN);
  const int nk = static_cast<int>(ceil_div(p.a.k, kBK));
  auto load = [&](int kt) {
    const uint32_t stage = base + (kt % kStages) * kStageBytes;
    const int64_t k0 = int64_t{kt} * kBK;
    load_tile<kBM, kBK, kThreads>(stage, A, te.rows_valid, k0, p.a.k, tid);
    load_tile<kBN, kBK, kThreads>(stage + kATileBytes, W, p.a.n - n0, k0, p.a.k, tid);
  };
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < nk) load(s);
    flash::cp_async_commit();
  }
  acc_fence(acc);
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kAhead - 1>();
    flash::fence_proxy_async();
    __syncthreads();
    if (kt + kAhead < nk) load(kt + kAhead);
    flash::cp_async_commit();
    const uint32_t stage = base + (kt % kStages) * kStageBytes;
    const uint64_t da = smem_desc(stage + wg * 64 * 128), db = smem_desc(stage + kATileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16(acc, da + 2 * kk, db + 2 * kk);
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  acc_fence(acc);
  cp_async_wait<0>();
  store_tile(acc, p.a.y, p.a.n, row0, n0, te.rows_valid, wg, tid);
#endif
}


// ---- The warp-specialised TMA variant ----------------------------------------------------------
// Same tile, stages and wgmma as above; the operands arrive by TMA instead: warp 8 (one thread)
// is the producer, warps 0-7 the two consumer warpgroups. Stage s has a `full` barrier (the
// producer's expect_tx; completes when the stage's bytes have landed) and an `empty` barrier
// (one arrival per consumer warpgroup once the wgmma reading the stage has retired), so no
// block-wide barrier runs in the k loop and the producer runs up to kStages steps ahead.
// x is one 2-D map (K, R), box 64 x 128; w a 3-D map (K, N/S, S E), box 64 x 64 x 1, four
// boxes per B tile (each inside one stack: needs N/S % 64 == 0), boxes wholly past N skipped.
// Both in the 128-byte swizzle, which is the layout the descriptors above read. Rows and
// columns past the tensors are zero-filled; rows of other experts inside a tile are loaded but
// never stored.
constexpr int kTmaThreads = 288;  // 2 consumer warpgroups + 1 producer warp
constexpr int kBoxRows = 64;
constexpr size_t kTmaSmemBytes = size_t{kStages} * kStageBytes + 2 * kStages * 8 + 1024;

struct TmaParams {
  const int32_t* offsets;  // (E + 1)
  const int32_t* counts;   // (E)
  gbf16* y;                // (R, N)
  int experts;
  int64_t n, k, n_per_stack;
  int tiles_m, tiles_n;
};

static __global__ void __launch_bounds__(kTmaThreads, 1)
    forward_tma_kernel(const __grid_constant__ CUtensorMap map_x,
                       const __grid_constant__ CUtensorMap map_w, const TmaParams p) {
#ifdef MOE_WGMMA
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (flash::smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t full0 = base + kStages * kStageBytes, empty0 = full0 + kStages * 8;
  int tm, tn;
  raster<8>(blockIdx.x, p.tiles_m, p.tiles_n, tm, tn);
  const int64_t row0 = int64_t{tm} * kBM;
  const TileExpert te = tile_expert(p.offsets, p.counts, p.experts, row0);
  if (te.rows_valid <= 0) return;
  const int64_t n0 = int64_t{tn} * kBN;
  const int tid = threadIdx.x, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    flash::fence_proxy_async();
  }
  __syncthreads();
  const int nk = static_cast<int>(ceil_div(p.k, kBK));

  if (warp == 8) {  // producer
    if ((tid & 31) == 0) {
      int boxes = 0;  // B boxes inside N (the rest are skipped)
      for (int q = 0; q < kBN / kBoxRows; ++q) boxes += n0 + q * kBoxRows < p.n;
      const uint32_t bytes = kATileBytes + boxes * kBoxRows * kBK * 2;
      for (int kt = 0; kt < nk; ++kt) {
        const int s = kt % kStages;
        if (kt >= kStages) mbar_wait(empty0 + 8 * s, ((kt / kStages) - 1) & 1);
        const uint32_t stage = base + s * kStageBytes, full = full0 + 8 * s;
        mbar_expect_tx(full, bytes);
        const int k0 = kt * kBK;
        tma_load_2d(stage, &map_x, k0, static_cast<int>(row0), full);
        for (int q = 0; q < boxes; ++q) {
          const int64_t n = n0 + q * kBoxRows, st = n / p.n_per_stack;
          tma_load_3d(stage + kATileBytes + q * kBoxRows * kBK * 2, &map_w, k0,
                      static_cast<int>(n - st * p.n_per_stack),
                      static_cast<int>(st * p.experts + te.e), full);
        }
      }
    }
    return;
  }

  const int wg = warp >> 2;  // consumer warpgroup 0 or 1
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  acc_fence(acc);
  for (int kt = 0; kt < nk; ++kt) {
    const int s = kt % kStages;
    mbar_wait(full0 + 8 * s, (kt / kStages) & 1);
    const uint32_t stage = base + s * kStageBytes;
    const uint64_t da = smem_desc(stage + wg * 64 * 128), db = smem_desc(stage + kATileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16(acc, da + 2 * kk, db + 2 * kk);
    wgmma_commit();
    wgmma_wait<1>();  // step kt - 1 has retired: its stage goes back to the producer
    if (kt > 0 && (tid & 127) == 0) mbar_arrive(empty0 + 8 * ((kt - 1) % kStages));
  }
  wgmma_wait<0>();
  acc_fence(acc);
  store_tile(acc, p.y, p.n, row0, n0, te.rows_valid, wg, tid & 127);
#endif
}

// ---- The weight gradient on the same machinery ---------------------------------------------------
// dW_e (N, K) += dY_e^T X_e is, with dyt = dY^T (N, R') and xt = X^T (K, R') (the row-major
// transposes, padding rows zeroed: see transpose_rows_kernel), the product dyt_e xt_e^T with
// both operands K-major (the reduction runs along their rows): the forward kernel's form with a
// per-expert reduction range. Block: tile (expert e, 128 rows of N, 256 of K) reducing over e's
// rows [offsets_e, offsets_e + counts_e) in steps of 64 (past the count: the transposes' zero
// columns, up to the 128-row padding); A box 64 x 128 of dyt, four 64 x 64 boxes of xt (those
// wholly past K skipped). Epilogue: f32 += into dW_e (stacked rows), each tile by one block.
struct WgradTmaParams {
  const int32_t* offsets;  // (E + 1)
  const int32_t* counts;   // (E)
  float* dw;               // (S, E, N/S, K)
  int experts;
  int64_t n, k, n_per_stack, stacks;
  int tiles_n, tiles_k;
};

static __global__ void __launch_bounds__(kTmaThreads, 1)
    wgrad_tma_kernel(const __grid_constant__ CUtensorMap map_dyt,
                     const __grid_constant__ CUtensorMap map_xt, const WgradTmaParams p) {
#ifdef MOE_WGMMA
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (flash::smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t full0 = base + kStages * kStageBytes, empty0 = full0 + kStages * 8;
  const int per_expert = p.tiles_n * p.tiles_k;
  const int e = blockIdx.x / per_expert, rem = blockIdx.x % per_expert;
  const int64_t n0 = int64_t{rem / p.tiles_k} * kBM, c0 = int64_t{rem % p.tiles_k} * kBN;
  const int count = p.counts[e];
  if (count == 0) return;
  const int r0 = p.offsets[e];
  const int tid = threadIdx.x, warp = tid >> 5;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    flash::fence_proxy_async();
  }
  __syncthreads();
  const int nk = (count + kBK - 1) / kBK;

  if (warp == 8) {  // producer
    if ((tid & 31) == 0) {
      int boxes = 0;
      for (int q = 0; q < kBN / kBoxRows; ++q) boxes += c0 + q * kBoxRows < p.k;
      const uint32_t bytes = kATileBytes + boxes * kBoxRows * kBK * 2;
      for (int kt = 0; kt < nk; ++kt) {
        const int s = kt % kStages;
        if (kt >= kStages) mbar_wait(empty0 + 8 * s, ((kt / kStages) - 1) & 1);
        const uint32_t stage = base + s * kStageBytes, full = full0 + 8 * s;
        mbar_expect_tx(full, bytes);
        const int t0 = r0 + kt * kBK;
        tma_load_2d(stage, &map_dyt, t0, static_cast<int>(n0), full);
        for (int q = 0; q < boxes; ++q)
          tma_load_2d(stage + kATileBytes + q * kBoxRows * kBK * 2, &map_xt, t0,
                      static_cast<int>(c0 + q * kBoxRows), full);
      }
    }
    return;
  }

  const int wg = warp >> 2;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  acc_fence(acc);
  for (int kt = 0; kt < nk; ++kt) {
    const int s = kt % kStages;
    mbar_wait(full0 + 8 * s, (kt / kStages) & 1);
    const uint32_t stage = base + s * kStageBytes;
    const uint64_t da = smem_desc(stage + wg * 64 * 128), db = smem_desc(stage + kATileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16(acc, da + 2 * kk, db + 2 * kk);
    wgmma_commit();
    wgmma_wait<1>();
    if (kt > 0 && (tid & 127) == 0) mbar_arrive(empty0 + 8 * ((kt - 1) % kStages));
  }
  wgmma_wait<0>();
  acc_fence(acc);
  const RowMatrix<float> DW = expert_weight(p.dw, e, p.experts, p.n_per_stack, p.k, p.stacks);
  const int lane = tid & 31, wq = warp & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t n = n0 + wg * 64 + wq * 16 + (lane >> 2) + 8 * half;
    if (n >= p.n) continue;
    float* row = DW.row(n);
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int64_t c = c0 + j * 8 + 2 * (lane & 3);
      if (c < p.k) {
        float2* d = reinterpret_cast<float2*>(row + c);
        float2 v = *d;
        v.x += acc[j * 4 + 2 * half];
        v.y += acc[j * 4 + 2 * half + 1];
        *d = v;
      }
    }
  }
#endif
}

// dst (C, ld) = src (R, C)^T with the rows outside every expert's range written as zeros (tiles
// of 64 rows lie inside one expert's 128-row padded range; columns R .. ld - 1 are not written).
static __global__ void transpose_rows_kernel(const uint16_t* src, uint16_t* dst, int64_t rows,
                                             int64_t cols, int64_t ld, const int32_t* offsets,
                                             const int32_t* counts, int experts) {
  __shared__ uint16_t tile[64][66];  // bf16 bits
  const int64_t c0 = int64_t{blockIdx.x} * 64, r0 = int64_t{blockIdx.y} * 64;
  const int64_t valid = tile_expert(offsets, counts, experts, r0).rows_valid;
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;
    const int64_t rr = r0 + r, cc = c0 + c;
    if (rr < rows && cc < cols) tile[r][c] = r < valid ? src[rr * cols + cc] : uint16_t{0};
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;  // r along cols, c along rows
    const int64_t cc = c0 + r, rr = r0 + c;
    if (rr < rows && cc < cols) dst[cc * ld + rr] = tile[c][r];
  }
}

// Built for this device (sm_90a code in the binary, a compute capability 9.0 GPU)?
bool available() {
  static const bool ok = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, forward_wgmma_kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    int dev = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (attr.binaryVersion != 90 || major != 9 || minor != 0) return false;
    CUDA_CHECK(cudaFuncSetAttribute(forward_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSmemBytes)));
    return true;
  }();
  return ok;
}

// cuTensorMapEncodeTiled from the driver (no link against libcuda); nullptr where absent.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() { return sm90::tensor_map_encoder(); }

bool tma_available() {
  static const bool ok = [] {
    if (!available() || encode_fn() == nullptr) return false;
    CUDA_CHECK(cudaFuncSetAttribute(forward_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kTmaSmemBytes)));
    CUDA_CHECK(cudaFuncSetAttribute(wgrad_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kTmaSmemBytes)));
    return true;
  }();
  return ok;
}

// A bf16 tensor map in the 128-byte swizzle: dims and box innermost first, strides in bytes.
CUtensorMap tensor_map(const void* p, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                       const cuuint32_t* box) {
  CUtensorMap m;
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank),
                                 const_cast<void*>(p), dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ENSURE(r == CUDA_SUCCESS, "grouped linear: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ")");
  return m;
}

}  // namespace

bool forward_sm90_available(bool tma) { return tma ? tma_available() : available(); }

bool forward_sm90_eligible(const ForwardArgs& a, bool tma) {
  if (!forward_sm90_available(tma)) return false;
  return !tma || (a.n_per_stack % kBoxRows == 0 && a.rows <= INT32_MAX && a.k <= INT32_MAX);
}

bool forward_sm90(const ForwardArgs& a, bool tma) {
  if (!forward_sm90_eligible(a, tma)) return false;
  const int64_t tiles_m = ceil_div(a.rows, kBM), tiles_n = ceil_div(a.n, kBN);
  if (tiles_m == 0 || tiles_n == 0) return true;
  ENSURE(tiles_m * tiles_n < INT32_MAX, "grouped linear: ", a.rows, " rows x ", a.n,
         " columns: too many tiles");
  const unsigned grid = static_cast<unsigned>(tiles_m * tiles_n);
  if (!tma) {
    FwdParams p{a, static_cast<int>(tiles_m), static_cast<int>(tiles_n)};
    forward_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream()>>>(p);
    check_launch("forward_wgmma_kernel");
    return true;
  }
  const cuuint64_t xd[2] = {static_cast<cuuint64_t>(a.k), static_cast<cuuint64_t>(a.rows)};
  const cuuint64_t xs[1] = {static_cast<cuuint64_t>(a.k) * 2};
  const cuuint32_t xb[2] = {kBK, kBM};
  const cuuint64_t wd[3] = {static_cast<cuuint64_t>(a.k), static_cast<cuuint64_t>(a.n_per_stack),
                            static_cast<cuuint64_t>(a.stacks * a.experts)};
  const cuuint64_t ws[2] = {static_cast<cuuint64_t>(a.k) * 2,
                            static_cast<cuuint64_t>(a.n_per_stack * a.k) * 2};
  const cuuint32_t wb[3] = {kBK, kBoxRows, 1};
  const CUtensorMap mx = tensor_map(a.x, 2, xd, xs, xb), mw = tensor_map(a.w, 3, wd, ws, wb);
  const TmaParams p{a.offsets, a.counts, a.y, a.experts, a.n, a.k, a.n_per_stack,
                    static_cast<int>(tiles_m), static_cast<int>(tiles_n)};
  forward_tma_kernel<<<grid, kTmaThreads, kTmaSmemBytes, stream()>>>(mx, mw, p);
  check_launch("forward_tma_kernel");
  return true;
}

bool wgrad_sm90(const WgradArgs& a) {
  if (!tma_available() || a.rows > INT32_MAX || a.k > INT32_MAX || a.n > INT32_MAX) return false;
  const int64_t tiles_n = ceil_div(a.n, kBM), tiles_k = ceil_div(a.k, kBN);
  const int64_t blocks = a.experts * tiles_n * tiles_k;
  if (blocks == 0 || a.rows == 0) return true;
  ENSURE(blocks < INT32_MAX, "grouped linear: too many weight-gradient tiles");
  // The transposes, ld a multiple of 8 (TMA strides are multiples of 16 bytes).
  const int64_t ld = (a.rows + 7) / 8 * 8;
  Owned dyt = empty({a.n, ld}, DType::BF16, Device::CUDA), xt = empty({a.k, ld}, DType::BF16, Device::CUDA);
  auto transpose = [&](const gbf16* src, int64_t cols, const Tensor& dst) {
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, 64)), static_cast<unsigned>(ceil_div(a.rows, 64)));
    transpose_rows_kernel<<<grid, 256, 0, stream()>>>(reinterpret_cast<const uint16_t*>(src),
                                                      static_cast<uint16_t*>(dst.data), a.rows, cols,
                                                      ld, a.offsets, a.counts, a.experts);
    check_launch("transpose_rows_kernel");
  };
  transpose(a.dy, a.n, dyt);
  transpose(a.x, a.k, xt);
  const cuuint64_t ad[2] = {static_cast<cuuint64_t>(ld), static_cast<cuuint64_t>(a.n)};
  const cuuint64_t bd[2] = {static_cast<cuuint64_t>(ld), static_cast<cuuint64_t>(a.k)};
  const cuuint64_t st[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t ab[2] = {kBK, kBM}, bb[2] = {kBK, kBoxRows};
  const CUtensorMap ma = tensor_map(dyt->data, 2, ad, st, ab), mb = tensor_map(xt->data, 2, bd, st, bb);
  const WgradTmaParams p{a.offsets, a.counts, a.dw, a.experts, a.n, a.k, a.n_per_stack, a.stacks,
                         static_cast<int>(tiles_n), static_cast<int>(tiles_k)};
  wgrad_tma_kernel<<<static_cast<unsigned>(blocks), kTmaThreads, kTmaSmemBytes, stream()>>>(ma, mb, p);
  check_launch("wgrad_tma_kernel");
  return true;
}

}  // namespace engine::cuda::grouped
