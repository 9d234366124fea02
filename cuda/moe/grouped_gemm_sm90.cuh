// Internal to the Hopper grouped GEMMs (grouped_gemm_sm90.cu: the persistent TMA kernel and its
// launch; grouped_gemm_sm90_launch.cu: its tensor maps and the entry points;
// grouped_gemm_sm90_cp_async.cu: the cp.async forward kernel): the tile shape and stage ring both
// kernels use, the wgmma helpers, the TMA kernel's parameters and launch, and the cp.async
// kernel's two entry points. nvcc only.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/common/sm90.cuh"
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

// d (64 x 256 f32, the wgmma accumulator fragment) += A (64 x 16, descriptor a) B (16 x 256,
// descriptor b)^T in shared memory, scale-d = 1 (accumulate); kTA / kTB = 1 read A / B MN-major
// (the transpose bits), 0 K-major.
template <int kTA, int kTB>
__device__ __forceinline__ void wgmma_tt(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, %130, %131;\n"
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
      : "l"(a), "l"(b), "n"(kTA), "n"(kTB));
}
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
