// CPU GEMM: C = alpha * op(A) @ op(B) + beta * C + bias.
// Algorithm (the classic Goto/BLIS loop nest, simplified):
//   1. Columns of C go in blocks of kBlockN. For each, the threads pack that block of op(B)
//      into column panels kNr wide (K x kNr each, zero padded), so the innermost loop reads B
//      contiguously whatever trans_b is, and the packed copy stays small (K x kBlockN).
//   2. The rows of C go in blocks of kBlockM, shared by OpenMP (schedule static). A task walks
//      K in chunks of kBlockK: it packs its rows of op(A) for the chunk into kMr-row groups
//      (kc x kMr), then for every column panel and row group runs a kMr x kNr register tile
//      over the chunk, accumulating into a per-thread (rows x kBlockN) buffer.
//   3. The epilogue writes C = alpha * acc + beta * C + bias (C not read when beta == 0).
// Each C element is therefore one sum over k in increasing order, the same on any thread count,
// so results are bitwise reproducible run to run. The tile is plain C++ that the compiler
// vectorises; one clone per ISA level (x86-64-v4 = AVX-512, v3 = AVX2 + FMA, baseline) is picked
// at load time. The compiler may fuse multiply-adds in the v3/v4 clones, so the last bits can
// differ between machines of different ISA levels, never between runs on one machine.
// The shared checks ran before (ops/gemm.cpp); the reference takes one dtype, f32 or f64, for
// a, b, c and the vectors.
#include "ops/gemm.h"

#include <algorithm>
#include <vector>

#include "core/buffer.h"
#include "ops/activation.h"
#include "ref/common.h"

namespace engine::ref {
namespace {

constexpr int64_t kMr = 4;          // rows of the register tile
constexpr int64_t kBlockM = 64;     // rows of C per parallel task (multiple of kMr)
constexpr int64_t kBlockK = 256;    // depth of one packed chunk of op(A)
constexpr int64_t kBlockN = 512;    // columns of C per packed block of op(B) (multiple of kNr)
template <typename T> constexpr int64_t kNr = 64 / sizeof(T);  // tile columns: one cache line
constexpr int64_t kParallelFlops = 1 << 20;  // below this many multiply-adds, stay on one thread

// The build targets baseline x86-64 (SSE2); the hot loop is also compiled for AVX2 and AVX-512
// and the best one the CPU supports is chosen when the program loads (GCC function clones).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ENGINE_GEMM_ISA_CLONES [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]]
#else
#define ENGINE_GEMM_ISA_CLONES
#endif

// Per-thread scratch that only grows, so repeated products of one shape do not allocate.
template <typename T, int kSlot>
T* scratch(size_t n) {
  thread_local std::vector<T> v;
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Packs columns [jb, jb + nb) of op(B) (K x N) into panels (nb / kNr, K, kNr), zero padded.
// Called inside the parallel region: the panels are shared out among the threads.
template <typename T>
void pack_b(int64_t jb, int64_t nb, int64_t n, int64_t k, const T* b, bool trans_b, T* bp) {
  constexpr int64_t nr = kNr<T>;
  const int64_t panels = (nb + nr - 1) / nr;
#pragma omp for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    T* dst = bp + p * k * nr;
    const int64_t j0 = jb + p * nr, w = std::min(nr, jb + nb - j0);
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t j = 0; j < w; ++j)
        dst[kk * nr + j] = trans_b ? b[(j0 + j) * k + kk] : b[kk * n + j0 + j];
      for (int64_t j = w; j < nr; ++j) dst[kk * nr + j] = T(0);
    }
  }
}

// acc (kMr x kNr, leading dimension ld) += ap (kc x kMr) @ bp (kc x kNr), k in order.
template <typename T>
[[gnu::always_inline]] inline void micro_tile(int64_t kc, const T* __restrict ap,
                                              const T* __restrict bp, T* __restrict acc,
                                              int64_t ld) {
  constexpr int64_t nr = kNr<T>;
  T r[kMr][nr];
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < nr; ++j) r[i][j] = acc[i * ld + j];
  for (int64_t kk = 0; kk < kc; ++kk) {
    const T* a = ap + kk * kMr;
    const T* bk = bp + kk * nr;
#pragma GCC unroll 4
    for (int64_t i = 0; i < kMr; ++i) {
      const T ai = a[i];
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) r[i][j] += ai * bk[j];
    }
  }
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < nr; ++j) acc[i * ld + j] = r[i][j];
}

// One task: rows [i0, i0 + mb) by columns [jb, jb + nb) of C; bp holds those columns of op(B)
// packed (panels x K x kNr).
template <typename T>
ENGINE_GEMM_ISA_CLONES void row_block(int64_t i0, int64_t mb, int64_t jb, int64_t nb, int64_t m,
                                      int64_t n, int64_t k, const T* a, bool trans_a, const T* bp,
                                      T* c, T alpha, T beta, const T* bias) {
  constexpr int64_t nr = kNr<T>;
  const int64_t panels = (nb + nr - 1) / nr, ld = panels * nr;
  const int64_t groups = (mb + kMr - 1) / kMr;
  T* acc = scratch<T, 0>(static_cast<size_t>(groups * kMr * ld));
  T* ap = scratch<T, 1>(static_cast<size_t>(groups * kMr * kBlockK));
  std::fill(acc, acc + groups * kMr * ld, T(0));
  for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
    const int64_t kc = std::min(kBlockK, k - k0);
    for (int64_t g = 0; g < groups; ++g) {  // pack op(A)[rows of g, k0 .. k0 + kc)
      T* dst = ap + g * kc * kMr;
      for (int64_t kk = 0; kk < kc; ++kk)
        for (int64_t r = 0; r < kMr; ++r) {
          const int64_t i = i0 + g * kMr + r;
          dst[kk * kMr + r] =
              i >= i0 + mb ? T(0) : trans_a ? a[(k0 + kk) * m + i] : a[i * k + k0 + kk];
        }
    }
    for (int64_t p = 0; p < panels; ++p) {
      const T* bpanel = bp + (p * k + k0) * nr;
      for (int64_t g = 0; g < groups; ++g)
        micro_tile(kc, ap + g * kc * kMr, bpanel, acc + g * kMr * ld + p * nr, ld);
    }
  }
  for (int64_t i = 0; i < mb; ++i) {
    T* crow = c + (i0 + i) * n + jb;
    const T* arow = acc + i * ld;
    for (int64_t j = 0; j < nb; ++j) {
      T v = alpha * arow[j];
      if (beta != T(0)) v += beta * crow[j];
      if (bias) v += bias[jb + j];
      crow[j] = v;
    }
  }
}

// The raw kernel behind matmul. Row-major, no leading dimensions: a is (M, K) or (K, M) with
// trans_a, b is (K, N) or (N, K) with trans_b, c is (M, N); bias is (N) or null.
template <typename T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, bool trans_a, const T* b, bool trans_b,
          T* c, T alpha, T beta, const T* bias) {
  if (m == 0 || n == 0) return;
  constexpr int64_t nr = kNr<T>;
  const int64_t blocks = (m + kBlockM - 1) / kBlockM;
  // A parallel region costs microseconds (and far more on a loaded machine): small products
  // and single row blocks stay on the calling thread.
  const bool parallel = blocks > 1 && m * n * k >= kParallelFlops;
  T* bp = scratch<T, 2>(static_cast<size_t>((std::min(n, kBlockN) + nr - 1) / nr * nr * k));
  // One parallel region; the implicit barrier after each `omp for` orders packing and use.
#pragma omp parallel if (parallel)
  for (int64_t jb = 0; jb < n; jb += kBlockN) {
    const int64_t nb = std::min(kBlockN, n - jb);
    pack_b(jb, nb, n, k, b, trans_b, bp);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t i0 = blk * kBlockM;
      row_block(i0, std::min(kBlockM, m - i0), jb, nb, m, n, k, a, trans_a, bp, c, alpha, beta,
                bias);
    }
  }
}

}  // namespace

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            const ops::MatmulOptions& options) {
  const char* op = "matmul";
  expect_dtype(b, a.dtype, op, "b (must match a)");
  expect_dtype(c, a.dtype, op, "c (must match a)");
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  const bool has_bias = options.bias.data != nullptr;
  if (has_bias) expect_dtype(options.bias, a.dtype, op, "bias");
  const bool gelu_in = options.gelu_input.data != nullptr, dgelu = options.dgelu_input.data != nullptr;
  const bool dbias = options.dbias.data != nullptr;
  if (dbias) expect_dtype(options.dbias, c.dtype, op, "dbias");
  // The addend (checked by ops::matmul) read in place of c: copied into c first.
  if (options.addend.data && options.addend.data != c.data && options.beta != 0.f) copy_tensor(c, options.addend);
  float_switch(a.dtype, op, "a", [&](auto tag) {
    using T = decltype(tag);
    gemm<T>(m, n, k, a.ptr<T>(), trans_a, b.ptr<T>(), trans_b, c.ptr<T>(), T(options.alpha),
            T(options.beta), has_bias ? options.bias.ptr<T>() : nullptr);
  });
  // The epilogues as the separate ops they fuse, in place on c.
  if (options.gelu) {
    if (gelu_in) copy_tensor(options.gelu_input, c);
    gelu_forward(gelu_in ? options.gelu_input : c, c);
  }
  if (dgelu) {
    gelu_backward(c, options.dgelu_input, c);
    if (dbias) sum_rows(c, options.dbias, 0.f);
  }
}

// out(j) = beta * out(j) + sum_i x(i, j), summed over i in order in double, parallel over columns.
void sum_rows(const Tensor& x, const Tensor& out, float beta) {
  const char* op = "sum_rows";
  expect_dtype(out, x.dtype, op, "out");
  const int64_t m = x.size(0), n = x.size(1);
  constexpr int64_t kCols = 256;
  float_switch(x.dtype, op, "x", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.ptr<T>();
    T* po = out.ptr<T>();
#pragma omp parallel for schedule(static) if (m * n > (1 << 16))
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
      const int64_t w = std::min(kCols, n - j0);
      double acc[kCols] = {};
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < w; ++j) acc[j] += static_cast<double>(px[i * n + j0 + j]);
      for (int64_t j = 0; j < w; ++j) {
        double v = acc[j];
        if (beta != 0.f) v += static_cast<double>(beta) * static_cast<double>(po[j0 + j]);
        po[j0 + j] = static_cast<T>(v);
      }
    }
  });
}

}  // namespace engine::ref
