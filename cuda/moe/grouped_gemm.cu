// Grouped GEMMs of the mixture of experts on tensor cores (contract: csrc/ops/moe.h; the CUDA
// side: moe.cuh): one launch covers every expert.
//   forward  y_rows(e)  = x_rows(e) W_e^T        A = x (kA),  B = W_e rows n (kB)
//   dgrad    dx_rows(e) = dy_rows(e) W_e         A = dy (kA), B = W_e rows n, columns k (kBTrans)
//   wgrad    dW_e      += dy_rows(e)^T x_rows(e)  A = dy^T (kATrans), B = x (kBTrans), f32 +=
// Algorithm: 128 x 128 output tiles, k steps of 64, 8 warps as 2 x 4 of 64 x 32 each;
// operands stream global -> shared with cp.async in a 3-stage ring (one barrier per k step:
// the slot refilled at step kt is the one every warp finished at kt - 1), the shared tiles are
// XOR-swizzled by 16-byte chunk (cuda/attention/flash_layout.h) and read with ldmatrix(.trans)
// into mma.sync.m16n8k16 bf16 -> f32 (flash_common.cuh's warp_gemm, reused as is).
// Tile scheduling (no host sync): expert e's rows start at offsets_e, a multiple of 128 (the
// dispatch pads every expert to kMoeRowAlign = kBM), so each 128-row tile of the permuted
// buffer belongs to one expert, found by a binary search of offsets; the grid covers the
// static bound of R rows and the tiles past offsets_E (or past an expert's count) exit at
// once. Row tiles go in groups of 8 with the column tile outer inside a group (blocks running
// together share A rows and B columns in L2). Rows past an expert's count are zero-filled on
// load and never stored. The weight gradient tiles are (expert, n tile, k tile); each block
// reduces over all of its expert's rows, so dW is read and written once per tile, without
// atomics (deterministic); experts with no rows exit.
// Weights may be S stacks (w (S, E, N/S, K), row n of W_e in stack n / (N/S)): every loaded or
// stored weight row computes its own address, so stacks of any height work.
// The launchers below run these kernels for GroupedKernel::Portable (ops/moe.h) and wherever the
// Hopper kernels (grouped_gemm_sm90*.cu) are not built for the device or do not take the shapes;
// otherwise (Auto on sm_90, Hopper) grouped_gemm_sm90.cu's persistent TMA wgmma kernel: all three
// products, the backward ones reading their operands MN-major (no transposed copies); the
// cp.async wgmma forward where the TMA kernel does not take the weight stacks.
// The shared preconditions ran before (ops/moe.cpp: shapes, the row operands in one dtype, with
// w's outside the weight gradient); the launchers check what is theirs: bf16 operands (dw f32),
// K and N multiples of 8, 16-byte aligned bf16 pointers (dw 8-byte), 32-bit tile counts.
#include <algorithm>
#include <mutex>

#include "cuda/common/launch.cuh"
#include "cuda/moe/grouped_gemm_common.cuh"
#include "cuda/moe/moe.cuh"
#include "ops/moe.h"

namespace engine::cuda {
namespace {

using flash::Operand;
using namespace grouped;

constexpr int kBM = 128, kBN = 128, kBK = 64;
constexpr int kThreads = 256;
constexpr int kStages = 3;
constexpr int kMI = 4, kNI = 4;  // warp tile 64 x 32 (16 x 8 mma tiles)
constexpr int kGroupM = 8;
constexpr uint32_t kTileBytes = kBM * kBK * 2;  // every operand tile is 128 x 64 or 64 x 128
constexpr uint32_t kStageBytes = 2 * kTileBytes;
constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes;
static_assert(kBM == ops::kMoeRowAlign, "one row tile must never hold two experts");

// The k-loop: acc += sum over nk steps of A_tile(kt) B_tile(kt); `load(slot, kt)` issues the
// cp.async copies of step kt into a stage, `mma(a_tile, b_tile)` consumes one.
template <typename Load, typename Mma>
__device__ __forceinline__ void mainloop(int nk, uint32_t s_base, Load&& load, Mma&& mma) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load(s_base + s * kStageBytes, s);
    flash::cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < nk) load(s_base + (next % kStages) * kStageBytes, next);
    flash::cp_async_commit();
    const uint32_t stage = s_base + (kt % kStages) * kStageBytes;
    mma(stage, stage + kTileBytes);
  }
  cp_async_wait<0>();
}

struct RowsParams {
  const gbf16* a;           // (R, red): x (forward) or dy (dgrad)
  const gbf16* w;           // (S, E, N/S, K)
  gbf16* out;               // (R, out_cols): y (forward) or dx (dgrad)
  const int32_t* offsets;   // (E + 1)
  const int32_t* counts;    // (E)
  int experts;
  int64_t n, k;             // W_e is (N, K)
  int64_t n_per_stack, stacks;
  int64_t red, out_cols;    // forward: K, N; dgrad: N, K
  int tiles_m, tiles_n;
};

// Forward (kDgrad false) and input gradient (true): one 128 x 128 tile of out per block.
template <bool kDgrad>
static __global__ void __launch_bounds__(kThreads, 2) grouped_rows_kernel(const RowsParams p) {
  FLASH_DYNAMIC_SMEM(smem);
  int tm, tn;
  raster(blockIdx.x, kGroupM, p.tiles_m, p.tiles_n, tm, tn);
  const int64_t row0 = int64_t{tm} * kBM;
  const TileExpert te = tile_expert(p.offsets, p.counts, p.experts, row0);
  if (te.rows_valid <= 0) return;
  const int e = te.e;
  const int64_t rows_valid = te.rows_valid;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / 4) * 64, wn0 = (warp % 4) * 32;
  const int64_t col0 = int64_t{tn} * kBN;
  const RowMatrix<const gbf16> A = RowMatrix<const gbf16>{p.a, p.red, 0, 0}.from(row0, kBM);
  const RowMatrix<const gbf16> W = expert_weight(p.w, e, p.experts, p.n_per_stack, p.k, p.stacks);
  const RowMatrix<const gbf16> W_cols = W.from(col0, kBN);  // forward: fixed weight rows
  float acc[kMI][kNI][4];
  flash::zero(acc);
  const int nk = static_cast<int>(ceil_div(p.red, kBK));
  mainloop(
      nk, flash::smem_u32(smem),
      [&](uint32_t stage, int kt) {
        const int64_t k0 = int64_t{kt} * kBK;
        load_tile<kBM, kBK, kThreads>(stage, A, rows_valid, k0, p.red, tid);
        if constexpr (!kDgrad)
          load_tile<kBN, kBK, kThreads>(stage + kTileBytes, W_cols, p.n - col0, k0, p.k, tid);
        else
          load_tile<kBK, kBN, kThreads>(stage + kTileBytes, W.from(k0, kBK), p.n - k0, col0, p.k, tid);
      },
      [&](uint32_t a_tile, uint32_t b_tile) {
        if constexpr (!kDgrad)
          flash::warp_gemm<kMI, kNI, kBK, Operand::kA, kBK, Operand::kB, kBK>(acc, a_tile, wm0,
                                                                             b_tile, wn0, lane);
        else
          flash::warp_gemm<kMI, kNI, kBK, Operand::kA, kBK, Operand::kBTrans, kBN>(
              acc, a_tile, wm0, b_tile, wn0, lane);
      });
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = wm0 + mi * 16 + (lane >> 2) + half * 8;
        const int64_t c = col0 + wn0 + ni * 8 + 2 * (lane & 3);
        if (r < rows_valid && c < p.out_cols)
          *reinterpret_cast<uint32_t*>(p.out + (row0 + r) * p.out_cols + c) =
              flash::pack_bf16(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      }
}

struct WgradParams {
  const gbf16* dy;          // (R, N)
  const gbf16* x;           // (R, K)
  float* dw;                // (S, E, N/S, K), +=
  const int32_t* offsets;   // (E + 1)
  const int32_t* counts;    // (E)
  int experts;
  int64_t n, k, n_per_stack, stacks;
  int tiles_n, tiles_k;
};

// dW_e tile (n0 .. n0 + 127, c0 .. c0 + 127) += over all rows of expert e.
static __global__ void __launch_bounds__(kThreads, 2) grouped_wgrad_kernel(const WgradParams p) {
  FLASH_DYNAMIC_SMEM(smem);
  const int per_expert = p.tiles_n * p.tiles_k;
  const int e = blockIdx.x / per_expert, rem = blockIdx.x % per_expert;
  const int64_t n0 = int64_t{rem / p.tiles_k} * kBM, c0 = int64_t{rem % p.tiles_k} * kBN;
  const int64_t count = p.counts[e];
  if (count == 0) return;
  const int64_t r0 = p.offsets[e];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / 4) * 64, wn0 = (warp % 4) * 32;
  const RowMatrix<const gbf16> DY{p.dy, p.n, 0, 0}, X{p.x, p.k, 0, 0};
  float acc[kMI][kNI][4];
  flash::zero(acc);
  const int nk = static_cast<int>(ceil_div(count, kBK));
  mainloop(
      nk, flash::smem_u32(smem),
      [&](uint32_t stage, int kt) {
        const int64_t t0 = int64_t{kt} * kBK;
        load_tile<kBK, kBM, kThreads>(stage, DY.from(r0 + t0, kBK), count - t0, n0, p.n, tid);
        load_tile<kBK, kBN, kThreads>(stage + kTileBytes, X.from(r0 + t0, kBK), count - t0, c0, p.k, tid);
      },
      [&](uint32_t a_tile, uint32_t b_tile) {
        flash::warp_gemm<kMI, kNI, kBK, Operand::kATrans, kBM, Operand::kBTrans, kBN>(
            acc, a_tile, wm0, b_tile, wn0, lane);
      });
  const RowMatrix<float> DW = expert_weight(p.dw, e, p.experts, p.n_per_stack, p.k, p.stacks);
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t n = n0 + wm0 + mi * 16 + (lane >> 2) + half * 8;
      if (n >= p.n) continue;
      float* row = DW.row(n);
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const int64_t c = c0 + wn0 + ni * 8 + 2 * (lane & 3);
        if (c < p.k) {
          float2* d = reinterpret_cast<float2*>(row + c);
          float2 v = *d;
          v.x += acc[mi][ni][2 * half];
          v.y += acc[mi][ni][2 * half + 1];
          *d = v;
        }
      }
    }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename Kernel>
void allow_smem(Kernel kernel, std::once_flag& flag) {
  std::call_once(flag, [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSmemBytes)));
  });
}

// The weight (or its gradient) in `wdtype`, K and N multiples of 8, aligned; returns its layout.
ops::GroupedWeight check_weight(const Tensor& w, DType wdtype, const char* op) {
  ops::expect_dtype(w, wdtype, op, "w");
  const ops::GroupedWeight g = ops::grouped_weight(w, op);
  ENSURE(g.k % 8 == 0 && g.n % 8 == 0, op, ": K = ", g.k, " and N = ", g.n,
         " must be multiples of 8 (16-byte rows)");
  ENSURE(aligned(w.data, wdtype == DType::F32 ? 8 : 16), op, ": w is not ",
         wdtype == DType::F32 ? 8 : 16, "-byte aligned");
  return g;
}

// A row operand (its shape checked before): bf16, 16-byte aligned.
void expect_rows(const Tensor& t, const char* op, const char* name) {
  ops::expect_dtype(t, DType::BF16, op, name);
  ENSURE(aligned(t.data, 16), op, ": ", name, " is not 16-byte aligned");
}

std::once_flag g_fwd_flag, g_dgrad_flag, g_wgrad_flag;

// Whether the Hopper kernels may run; GroupedKernel::Hopper on a device without them is an error.
bool try_hopper(ops::GroupedKernel kernel, const char* op) {
  if (kernel == ops::GroupedKernel::Hopper)
    ENSURE(grouped::tma_available(), op, ": the Hopper (TMA wgmma) kernels are not built for this device");
  return kernel != ops::GroupedKernel::Portable;
}

void launch_rows(bool dgrad, const Tensor& a, const Tensor& w, const Tensor& offsets,
                 const Tensor& counts, const Tensor& out, const ops::GroupedWeight& g) {
  RowsParams p{};
  p.a = static_cast<const gbf16*>(a.data);
  p.w = static_cast<const gbf16*>(w.data);
  p.out = static_cast<gbf16*>(out.data);
  p.offsets = offsets.ptr<int32_t>();
  p.counts = counts.ptr<int32_t>();
  p.experts = static_cast<int>(g.experts);
  p.n = g.n;
  p.k = g.k;
  p.n_per_stack = g.n_per_stack();
  p.stacks = g.stacks;
  p.red = dgrad ? g.n : g.k;
  p.out_cols = dgrad ? g.k : g.n;
  const int64_t rows = a.size(0);
  const int64_t tiles_m = ceil_div(rows, kBM), tiles_n = ceil_div(p.out_cols, kBN);
  if (tiles_m == 0 || tiles_n == 0) return;
  ENSURE(tiles_m * tiles_n < INT32_MAX, "grouped linear: ", rows, " rows x ", p.out_cols,
         " columns: too many tiles");
  p.tiles_m = static_cast<int>(tiles_m);
  p.tiles_n = static_cast<int>(tiles_n);
  const unsigned grid = static_cast<unsigned>(tiles_m * tiles_n);
  if (dgrad) {
    allow_smem(grouped_rows_kernel<true>, g_dgrad_flag);
    grouped_rows_kernel<true><<<grid, kThreads, kSmemBytes, stream()>>>(p);
    check_launch("grouped_rows_kernel<dgrad>");
  } else {
    allow_smem(grouped_rows_kernel<false>, g_fwd_flag);
    grouped_rows_kernel<false><<<grid, kThreads, kSmemBytes, stream()>>>(p);
    check_launch("grouped_rows_kernel<forward>");
  }
}

}  // namespace

bool grouped_hopper_available() { return grouped::tma_available(); }

void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                            const Tensor& counts, const Tensor& y,
                            const ops::GroupedLinearOptions& options) {
  const char* op = "grouped_linear_forward";
  const ops::GroupedWeight g = check_weight(w, DType::BF16, op);
  const int64_t R = x.size(0);
  expect_rows(x, op, "x");
  expect_rows(y, op, "y");
  const ForwardArgs a{static_cast<const gbf16*>(x.data), static_cast<const gbf16*>(w.data),
                      static_cast<gbf16*>(y.data), offsets.ptr<int32_t>(), counts.ptr<int32_t>(),
                      static_cast<int>(g.experts), R, g.n, g.k, g.n_per_stack(), g.stacks};
  if (try_hopper(options.kernel, op) && forward_sm90(a)) return;
  launch_rows(false, x, w, offsets, counts, y, g);
}

void grouped_linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                   const Tensor& counts, const Tensor& dx,
                                   const ops::GroupedLinearOptions& options) {
  const char* op = "grouped_linear_backward_input";
  const ops::GroupedWeight g = check_weight(w, DType::BF16, op);
  const int64_t R = dy.size(0);
  expect_rows(dy, op, "dy");
  expect_rows(dx, op, "dx");
  // The TMA kernel reads W_e MN-major (no copy) where it takes the weights' stacks; else the
  // mma.sync kernel (W_e through ldmatrix.trans).
  const ForwardArgs a{static_cast<const gbf16*>(dy.data), static_cast<const gbf16*>(w.data),
                      static_cast<gbf16*>(dx.data), offsets.ptr<int32_t>(), counts.ptr<int32_t>(),
                      static_cast<int>(g.experts), R, g.n, g.k, g.n_per_stack(), g.stacks};
  if (try_hopper(options.kernel, op) && dgrad_sm90(a)) return;
  launch_rows(true, dy, w, offsets, counts, dx, g);
}

void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                    const Tensor& counts, const Tensor& dw,
                                    const ops::GroupedLinearOptions& options) {
  const char* op = "grouped_linear_backward_weight";
  const ops::GroupedWeight g = check_weight(dw, DType::F32, op);
  const int64_t R = dy.size(0);
  expect_rows(dy, op, "dy");
  expect_rows(x, op, "x");
  // The TMA kernel (on sm_90) at every size, small experts included (faster than mma.sync in
  // every case; figures: docs/PERF.md).
  if (try_hopper(options.kernel, op)) {
    const WgradArgs a{static_cast<const gbf16*>(dy.data), static_cast<const gbf16*>(x.data),
                      dw.ptr<float>(), offsets.ptr<int32_t>(), counts.ptr<int32_t>(),
                      static_cast<int>(g.experts), R, g.n, g.k, g.n_per_stack(), g.stacks};
    if (wgrad_sm90(a)) return;
  }
  const int64_t tiles_n = ceil_div(g.n, kBM), tiles_k = ceil_div(g.k, kBN);
  const int64_t blocks = g.experts * tiles_n * tiles_k;
  if (blocks == 0 || R == 0) return;
  ENSURE(blocks < INT32_MAX, op, ": too many tiles");
  WgradParams p{};
  p.dy = static_cast<const gbf16*>(dy.data);
  p.x = static_cast<const gbf16*>(x.data);
  p.dw = dw.ptr<float>();
  p.offsets = offsets.ptr<int32_t>();
  p.counts = counts.ptr<int32_t>();
  p.experts = static_cast<int>(g.experts);
  p.n = g.n;
  p.k = g.k;
  p.n_per_stack = g.n_per_stack();
  p.stacks = g.stacks;
  p.tiles_n = static_cast<int>(tiles_n);
  p.tiles_k = static_cast<int>(tiles_k);
  allow_smem(grouped_wgrad_kernel, g_wgrad_flag);
  grouped_wgrad_kernel<<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream()>>>(p);
  check_launch("grouped_wgrad_kernel");
}

}  // namespace engine::cuda
