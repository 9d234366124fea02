// Internal to the Hopper grouped GEMMs (grouped_gemm_sm90.cu: the persistent TMA kernel and its
// launch; grouped_gemm_sm90_launch.cu: its tensor maps and the entry points;
// grouped_gemm_sm90_cp_async.cu: the cp.async forward kernel): the tile shape and stage ring both
// kernels use, the wgmma helpers, the TMA kernel's parameters and launch, and the cp.async
// kernel's two entry points. nvcc only.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/common/sm90.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/moe/grouped_gemm_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_WGMMA 1
#endif

namespace engine::cuda::grouped::wgmma_detail {

constexpr int kBM = 128, kBN = 256, kBK = 64;
constexpr int kThreads = 256;
constexpr int kStages = 4, kAhead = kStages - 2;
constexpr uint32_t kATileBytes = kBM * kBK * 2, kBTileBytes = kBN * kBK * 2;
constexpr uint32_t kStageBytes = kATileBytes + kBTileBytes;
constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes + 1024;  // + alignment slack
static_assert(kBM == ops::kMoeRowAlign, "one row tile must never hold two experts");

#ifdef MOE_WGMMA
using sm90::wgmma_commit;
using sm90::reg_fence;  // keeps accumulator reads / writes on their side of a wgmma
using sm90::wgmma_fence;
using sm90::wgmma_wait;

// Shared-memory matrix descriptor: 128-byte swizzle, 1024 bytes between 8-row groups.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) { return sm90::smem_desc_sw128(addr, 16); }

using sm90::wgmma_m64n256k16_tt;
#endif  // MOE_WGMMA

// The persistent TMA kernel (grouped_gemm_sm90.cu) for the three products.
enum Mode : int { kFwd = 0, kDgrad = 1, kWgrad = 2 };
constexpr int kBox = 64;  // rows of a TMA box (each row 64 bf16 = 128 bytes)
struct TmaParams {
  const int32_t* offsets;  // (E + 1)
  const int32_t* counts;   // (E)
  void* out;               // forward y / dgrad dx (R, out_cols) bf16; wgrad dW (S, E, N/S, K) f32
  int experts;
  int64_t out_cols;        // forward N, dgrad K, wgrad K
  int64_t red;             // reduction: forward K, dgrad N (wgrad: the expert's rows)
  int64_t m_rows;          // wgrad: N (rows of dW); forward, dgrad: R
  int64_t n_per_stack;     // weight (dW) rows per stack
  int64_t stacks;
  int tiles_m, tiles_n, pairs_m;  // 128-row tiles, 256-column tiles, ceil(tiles_m / 2)
  int units;
  int group;               // raster: pairs of row tiles per group (kRasterGroup, at most pairs_m)
  bool tma_epi;            // wgrad: dW's map takes the TMA reductions (else the threads' adds)
};

// Raises the TMA kernels' shared-memory limit (called once, where they are built for the device).
void tma_allow_smem();
// One launch of mode `mode` on the operands' tensor maps ma, mb (mc: the wgrad's dW map for the
// TMA epilogue where tma_epi, else unused); group and tma_epi of p are set here.
void launch_tma(Mode mode, const CUtensorMap& ma, const CUtensorMap& mb, const CUtensorMap& mc,
                bool tma_epi, const TmaParams& p);

// The cp.async forward kernel (grouped_gemm_sm90_cp_async.cu). Whether it is built for this
// device (sm_90a code in the binary, a compute capability 9.0 GPU; the TMA kernel's own check
// starts from it), and its launch over the tiles_m x tiles_n output tiles of a (checked) call.
bool cp_async_available();
void cp_async_forward(const ForwardArgs& a, int64_t tiles_m, int64_t tiles_n);

}  // namespace engine::cuda::grouped::wgmma_detail
