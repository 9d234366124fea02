// The cp.async forward kernel on Hopper (sm_90a): y_rows(e) = x_rows(e) W_e^T, one tile per
// block, for the shapes the TMA kernel of grouped_gemm_sm90.cu does not take (S > 1 weight stacks
// with N/S % 64 != 0, whose rows a 64-row weight box would take from two stacks: each row here
// computes its own address; K = 0).
// Block: 128 x 256 output tile, two consumer warpgroups of 64 x 256 each (wgmma m64n256k16, 128
// f32 accumulators per thread), k steps of 64. All 256 threads stream A (128 x 64) and B
// (256 x 64) with cp.async into a 4-stage ring of 48 KiB stages, each operand tile in the
// 128-byte swizzled K-major layout wgmma reads through a matrix descriptor
// (grouped_gemm_common.cuh load_tile<.., 64, ..>: row r at 128 r bytes, 16-byte chunk c at
// c ^ (r % 8); stage bases 1024-byte aligned; descriptor stride between 8-row groups 1024 bytes,
// 128-byte swizzle mode; a k16 step advances the start address by 32 bytes). Per k step:
//   wait for the step's copies, fence them to the async proxy, barrier (also: both warpgroups
//   have retired the wgmma of step kt - 2, whose stage the next copies overwrite), issue the
//   copies of step kt + 2, then 4 wgmma on stage kt, commit, and wait until at most one group
//   (this step's) is in flight.
// Rows past the expert's count are zero-filled and never stored; columns past N likewise.
#include "core/check.h"
#include "cuda/common/launch.cuh"
#include "cuda/moe/grouped_gemm_sm90.cuh"

namespace engine::cuda::grouped {
namespace {

using namespace wgmma_detail;

#ifdef MOE_WGMMA
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
  raster(blockIdx.x, 8, p.tiles_m, p.tiles_n, tm, tn);
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
  reg_fence(acc);
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
    for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16_tt<0, 0>(acc, da + 2 * kk, db + 2 * kk);
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  reg_fence(acc);
  cp_async_wait<0>();
  store_tile(acc, p.a.y, p.a.n, row0, n0, te.rows_valid, wg, tid);
#endif
}

}  // namespace

namespace wgmma_detail {

// Built for this device (sm_90a code in the binary running on a compute capability 9.0 GPU:
// the capability layer, cuda/common/arch.h)?
bool cp_async_available() {
  static const bool ok = [] {
    if (!sm90::sm90_kernel_runs(reinterpret_cast<const void*>(forward_wgmma_kernel))) return false;
    CUDA_CHECK(cudaFuncSetAttribute(forward_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSmemBytes)));
    return true;
  }();
  return ok;
}

void cp_async_forward(const ForwardArgs& a, int64_t tiles_m, int64_t tiles_n) {
  ENSURE(tiles_m * tiles_n < INT32_MAX, "grouped linear: ", a.rows, " rows x ", a.n,
         " columns: too many tiles");
  const unsigned grid = static_cast<unsigned>(tiles_m * tiles_n);
  FwdParams p{a, static_cast<int>(tiles_m), static_cast<int>(tiles_n)};
  forward_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream()>>>(p);
  check_launch("forward_wgmma_kernel");
}

}  // namespace wgmma_detail
}  // namespace engine::cuda::grouped
