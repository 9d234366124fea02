// CUDA launchers of Mamba's selective scan (contract: csrc/ops/mamba.h; kernels: scan.cu and, for
// the variants below, scan_lean.cu and scan_docs.cu). Activations, weights (A_log, D, dt_bias)
// and activation gradients bf16 (column blocks of row-major tensors, any alignment); chunk_states
// f32; dA_log, dD, ddt_bias f32, accumulated (+=) by deterministic reductions. N <= 16,
// chunk_len <= 128.
#pragma once
#include "ops/mamba.h"

namespace engine::cuda {

void selective_scan_forward(const ops::ScanArgs& a, const ops::ColumnBlock& y,
                            const Tensor& chunk_states);
void selective_scan_backward(const ops::ScanArgs& a, const ops::ColumnBlock& dy,
                             const Tensor& chunk_states, const ops::ScanGrads& g);

// Implementation variants, chosen at run time so that tests and the bench run them side by side.
// Every variant meets the same contract; results differ in rounding only (chunk_states from any
// forward feed any backward). The process-wide choice is read at each launch (not synchronised:
// set it before launching work, from one thread).
enum class ScanForward {
  kChunked,    // chunk summary + combine + output kernels (scan.cu)
  kLean,       // the same three steps with fewer instructions per state (scan_lean.cu)
  kLeanPoly1,  // kLean with 1 of the 16 states' exps on the FMA pipes (cuda/mamba/poly_math.h)
  kLeanPoly2,  // kLean with 2 of 16 on the FMA pipes
  kLeanPoly4,  // kLean with 4 of 16 on the FMA pipes
  kLeanPoly2S, // kLean with 2 of 16 on the FMA pipes in the chunk summary, none in the output step
  kDocs2,      // one pass along each document, 2 threads per channel (scan_docs.cu): one exp per
               // element instead of two, parallel over documents x channels only
  kDocs2Poly1, // kDocs2 with 1 of each thread's 8 states on the FMA pipes
  kDocs4,      // one pass, 4 threads per channel (twice the threads of kDocs2)
};
enum class ScanBackward {
  kChunked,    // carry summary + combine + the two-pass main kernel (scan.cu)
  kLean,       // the same steps with fewer instructions per state (scan_lean.cu)
  kLeanPoly1,  // kLean with 1 of 16 states' exps of the carry summary on the FMA pipes
  kLeanPoly2,  // kLean with 2 of 16 of the carry summary on the FMA pipes
};
// The default: kLean both ways. On one H200 at 32768 tokens, Di 4096, N 16 (8 x 4096 and
// 1 x 32768 alike), forward 1.70 ms against 2.18 ms chunked, backward 5.32 ms against 8.34 ms;
// every variant passed the GPU kernel tests against the f64 reference in the same call. (kDocs4
// was faster forward at 8 x 4096, 1.56 ms, but 9.2 ms at 1 x 32768: one thread group walks a
// whole document.)
struct ScanVariant {
  ScanForward forward = ScanForward::kLean;
  ScanBackward backward = ScanBackward::kLean;
};
// The one-pass forwards (one exp per element, parallel over documents x channels only).
inline bool one_pass(ScanForward v) {
  return v == ScanForward::kDocs2 || v == ScanForward::kDocs2Poly1 || v == ScanForward::kDocs4;
}
void set_scan_variant(ScanVariant v);
ScanVariant scan_variant();
// Short names ("chunked", "lean", "lean-poly2", ...), as the bench prints them.
const char* scan_variant_name(ScanForward v);
const char* scan_variant_name(ScanBackward v);
inline constexpr ScanForward kScanForwards[] = {
    ScanForward::kChunked,     ScanForward::kLean,  ScanForward::kLeanPoly1,   ScanForward::kLeanPoly2,
    ScanForward::kLeanPoly4,   ScanForward::kLeanPoly2S, ScanForward::kDocs2, ScanForward::kDocs2Poly1,
    ScanForward::kDocs4};
inline constexpr ScanBackward kScanBackwards[] = {ScanBackward::kChunked, ScanBackward::kLean,
                                                  ScanBackward::kLeanPoly1, ScanBackward::kLeanPoly2};

}  // namespace engine::cuda
