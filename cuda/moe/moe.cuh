// The CUDA side of the mixture-of-experts ops (ops/moe.h declares them, engine::cuda:: included;
// contract, formulas and shapes there), and the one CUDA-only entry point the tests and the bench
// use. Kernels: routing.cu (route forward / backward, aux losses, jitter), dispatch.cu (histogram,
// padded offsets, stable rows, permute / unpermute), grouped_gemm.cu and grouped_gemm_sm90*.cu
// (the expert GEMMs on tensor cores, one launch over all experts).
//   route forward    logits (T, E) f32 -> probs (T, E) f32 (may alias logits), lse (T) f32,
//                    expert_idx (T, k) i32, weights (T, k) f32. One warp per token.
//   aux losses       probs, lse f32, counts (E) i32 -> losses (2) f32 on the device (no sync);
//                    one block, fixed summation order (deterministic).
//   route backward   dweights, probs, lse, weights f32, expert_idx, counts i32 -> dlogits (T, E)
//                    bf16 or f32.
//   dispatch         expert_idx (T, k) -> counts (E), offsets (E + 1), row_of (T, k), all i32;
//                    three kernels (block histograms, one-block scan, stable block ranks); no
//                    host sync; deterministic.
//   permute, unpermute (+ backward): rows of bf16 or f32, 16-byte vectors when the row length
//                    and the pointers allow, f32 sums, one block per token.
//   grouped linear   bf16 x / dy / w, bf16 y / dx, f32 dw (+=): see grouped_gemm.cu (the
//                    portable mma.sync kernels) and grouped_gemm_sm90.cu (on sm_90 all three
//                    products on one persistent wgmma kernel, operands by TMA, 2-CTA clusters
//                    multicasting the shared operand; the backward reads its operands MN-major,
//                    no transposed copies). Needs K and N multiples of 8, 16-byte aligned bf16
//                    pointers (8-byte dw) and expert offsets that are multiples of
//                    ops::kMoeRowAlign (moe_dispatch's). GroupedKernel::Hopper where it is not
//                    available is an error.
// E <= ops::kMoeMaxExperts, k <= ops::kMoeMaxTopK. Every launcher runs on the compute stream.
// The preconditions both backends share run in ops/moe.cpp; the launchers check the rest.
#pragma once

namespace engine::cuda {

// Whether GroupedKernel::Hopper runs on this device (the persistent TMA wgmma kernel is built
// for it: sm_90a code in the binary, a compute capability 9.0 GPU).
bool grouped_hopper_available();

}  // namespace engine::cuda
