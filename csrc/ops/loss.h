// Losses over logits (T, V): the label cross-entropy (with z-loss and label smoothing) and the
// distillation losses against a teacher's logits, each fused with its gradient written in place
// over the logits; and their vocabulary-parallel forms (partial -> all-gather -> combine -> grad).
//
// ---- Cross-entropy. For every row t with mask(t) != 0, x = logits_t, lse = log sum_v exp(x_v),
// z = z_loss, eps = label_smoothing, V the vocabulary:
//   losses(t) = lse - (1 - eps) x[label] - eps mean_v x_v + z lse^2
//             (the cross-entropy against the target (1 - eps) onehot(label) + eps / V, plus the
//              z-loss; z = eps = 0 is the plain cross-entropy lse - x[label])
//   with_grad: x_v <- grad_scale * ((1 + 2 z lse) softmax(x)_v - (1 - eps) [v == label] - eps / V)
// Masked rows get losses(t) = 0 and (with_grad) a zero gradient row. labels (T) i32 in [0, V)
// where the mask is set; mask (T) u8; losses (T) f32 (f64 when logits are f64). The caller sums
// losses and divides by the number of loss tokens in the global batch (grad_scale = 1 / that).
// Label smoothing averages over the logits: they must be finite (a -inf logit makes the loss inf).
// columns > 0: only the first `columns` columns of each row are the vocabulary (V = columns),
// the rest is row padding, never read or written (logits padded to a multiple of 8 columns keep
// every row 16-byte aligned, which the GEMMs around the loss need for their fast kernels; see
// layers/lm_head.cpp); 0: all of them.
//
// Vocabulary-parallel cross-entropy: the same loss and gradient when each of P ranks holds the
// logits of a contiguous block of columns. logits (T, Vl) are the columns
// [vocab_begin, vocab_begin + Vl) of a vocabulary of vocab_total; labels (T) i32 and mask (T) u8
// are the full (replicated) ones. The "stat dtype" is f32 for bf16 or f32 logits, f64 for f64
// logits. Three steps, with an all-gather of the (K, T) stats between the first two (K = 3, or 4
// with label smoothing):
//   cross_entropy_partial  stats (K, T):  per masked-in row t
//       stats[0][t] = m = max_v x_v          (-inf when Vl = 0)
//       stats[1][t] = s = sum_v exp(x_v - m)
//       stats[2][t] = z = x[label - vocab_begin] if the label is in this shard, else 0
//       stats[3][t] = sum_v x_v / vocab_total  (K = 4 only: the shard's share of the mean logit)
//     masked rows: all K 0 (their labels are never read). A label outside [0, vocab_total)
//     at a masked-in row is an error naming the position and the label.
//   cross_entropy_combine  partials (P, K, T): the P shards' stats stacked in shard order.
//     Per masked-in row: M = max_p m_p, S = sum_p s_p exp(m_p - M), lse(t) = M + log S,
//     losses(t) = lse - (1 - eps) sum_p z_p - eps sum_p stats[3]_p + z lse^2 (eps != 0 needs
//     K = 4); masked rows: lse = 0, losses = 0. lse, losses (T) in the stat dtype. Fixed order
//     over p: every rank combining the same partials gets the same bits.
//   cross_entropy_grad     in place on the shard's logits, per masked-in row:
//       x_v <- grad_scale * ((1 + 2 z lse) exp(x_v - lse(t)) - (1 - eps) [v + vocab_begin ==
//              label(t)] - eps / vocab_total)
//     masked rows become zero rows; lse (T) in the stat dtype (from combine). Labels outside the
//     shard match no column (partial has checked them). vocab_total is read only when eps != 0
//     (it must then be > 0).
// With P = 1 and vocab_begin = 0 the three compose to cross_entropy above. On CUDA lse is f32,
// so the gradient carries a relative error of about |lse| * 2^-24 on top of the kernel's own
// (6e-5 at |lse| = 1000; far below bf16 rounding), which the fused kernel avoids by keeping
// max and log-sum apart.
//
// ---- Distillation against a teacher's logits y (T, V) (same dtype and shape as the student's
// x = logits, read only). With a temperature tau > 0 on both, s = softmax(x / tau),
// q = softmax(y / tau), per masked-in row:
//   SoftCE     D = -sum_v q_v log s_v                     dD/dx_v = (s_v - q_v) / tau
//   ForwardKL  D = sum_v q_v (log q_v - log s_v)          dD/dx_v = (s_v - q_v) / tau
//   ReverseKL  D = sum_v s_v (log s_v - log q_v)          dD/dx_v = s_v (log s_v - log q_v - D) /
//   tau
// (no tau^2 factor: fold it into distill_weight if wanted). The label term is the cross-entropy
// above on the untempered logits with z-loss (no label smoothing): C = lse(x) - x[label] +
// z lse(x)^2. The op writes
//   losses(t)         = label_weight * C + distill_weight * D   (0 where masked)
//   distill_losses(t) = D                                      (optional; 0 where masked)
//   with_grad: x_v <- grad_scale * (label_weight dC/dx_v + distill_weight dD/dx_v), zero rows
//              where masked
// label_weight = 0: distillation only; labels and z_loss are then never read (labels may be
// undefined). The logits must be finite. losses, distill_losses (T) in the stat dtype.
//
// Vocabulary-parallel distillation: logits and teacher (T, Vl) are the same columns
// [vocab_begin, vocab_begin + Vl) of a vocabulary of vocab_total. Every per-row quantity the
// gradient needs crosses the shards through the stats, so the gradient is local:
//   distillation_partial  stats (kDistillStats = 7, T) in the stat dtype, per masked-in row
//       [0] mx = max_v x_v                 (-inf when Vl = 0)
//       [1] sx = sum_v exp(x_v - mx)       (label_weight != 0, else 0)
//       [2] z  = x[label - vocab_begin] if the label is in this shard, else 0 (label_weight != 0)
//       [3] ss = sum_v exp((x_v - mx) / tau)
//       [4] my = max_v y_v                 (-inf when Vl = 0)
//       [5] sq = sum_v exp((y_v - my) / tau)
//       [6] w  = SoftCE:    sum_v exp((y_v - my) / tau) (x_v - mx) / tau
//                ForwardKL: sum_v exp((y_v - my) / tau) ((y_v - my) - (x_v - mx)) / tau
//                ReverseKL: sum_v exp((x_v - mx) / tau) ((x_v - mx) - (y_v - my)) / tau
//     masked rows: all 0. Labels are checked as in cross_entropy_partial (label_weight != 0).
//   distillation_combine  partials (P, 7, T) -> row_stats (kDistillRowStats = 6, T), losses (T),
//     distill_losses (T, optional), all in the stat dtype. Per masked-in row, with
//     Mx = max_p mx_p, My = max_p my_p, ex_p = exp((mx_p - Mx) / tau), ey_p = exp((my_p - My) /
//     tau), dx_p = (mx_p - Mx) / tau, dy_p = (my_p - My) / tau (shards with Vl = 0 add nothing):
//       Sx = sum_p sx_p exp(mx_p - Mx), Ss = sum_p ss_p ex_p, Sq = sum_p sq_p ey_p
//       SoftCE:    W = sum_p ey_p (w_p + dx_p sq_p),            D = log Ss - W / Sq
//       ForwardKL: W = sum_p ey_p (w_p + (dy_p - dx_p) sq_p),   D = log Ss - log Sq + W / Sq
//       ReverseKL: W = sum_p ex_p (w_p + (dx_p - dy_p) ss_p),   D = log Sq - log Ss + W / Ss
//       C = (Mx - sum_p z_p) + log Sx + z (Mx + log Sx)^2; losses, distill_losses as above
//       row_stats = [Mx, log Sx, log Ss, My, log Sq, c] with c = W / Ss for ReverseKL
//       (= sum_v s_v ((x_v - Mx) - (y_v - My)) / tau = D + log Ss - log Sq), else 0
//     (log Sx = 0 when label_weight = 0); masked rows: all outputs 0. Fixed order over p.
//   distillation_grad  in place on the shard's logits, per masked-in row, with
//     ls_v = (x_v - Mx) / tau - log Ss (= log s_v), lq_v = (y_v - My) / tau - log Sq:
//       dD = (exp(ls_v) - exp(lq_v)) / tau;  ReverseKL: exp(ls_v) (((x_v - Mx) - (y_v - My)) / tau
//       - c) / tau dC = (1 + 2 z (Mx + log Sx)) exp(x_v - Mx - log Sx) - [v + vocab_begin == label]
//       x_v <- grad_scale * (label_weight dC + distill_weight dD); masked rows become zero rows.
// With P = 1 and vocab_begin = 0 the three compose to distillation_loss. Max and log-sums stay
// apart in row_stats, so no |lse| 2^-24 error arises on CUDA.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/op.h"

namespace engine::ops {

enum class DistillKind { SoftCE, ForwardKL, ReverseKL };

struct DistillParams {
  DistillKind kind = DistillKind::ForwardKL;
  float temperature = 1.f;     // tau > 0, divides the student's and the teacher's logits
  float label_weight = 0.f;    // weight of the label cross-entropy (untempered, with z-loss)
  float distill_weight = 1.f;  // weight of the distillation term D
  float z_loss = 0.f;          // z-loss coefficient inside the label term
};

const char* distill_kind_name(DistillKind kind);

constexpr int64_t kDistillStats = 7;     // rows of distillation_partial's stats
constexpr int64_t kDistillRowStats = 6;  // rows of distillation_combine's row_stats

}  // namespace engine::ops

// Shared preconditions (ops/loss.cpp; an engine::Error naming op and value): z_loss finite,
// label_smoothing in [0, 1]; temperature finite and > 0, weights and z_loss finite, a known kind.
// cross_entropy: columns = 0 when every column is the vocabulary (see above).
// cross_entropy_partial: stats (3, T), or (4, T) to also collect what label smoothing needs.
// cross_entropy_grad: vocab_total is read only with label smoothing (0 otherwise is fine).
// Distillation: labels (T) i32, read only when label_weight != 0 (else may be Tensor{});
// distill_losses (T) or Tensor{}.
#define ENGINE_LOSS_OPS(OP)                                                                      \
  OP(void, cross_entropy,                                                                        \
     (const Tensor& logits, const Tensor& labels, const Tensor& mask, const Tensor& losses,      \
      bool with_grad, float grad_scale, float z_loss, float label_smoothing, int64_t columns),   \
     (logits, labels, mask, losses, with_grad, grad_scale, z_loss, label_smoothing, columns))    \
  OP(void, cross_entropy_partial,                                                                \
     (const Tensor& logits, const Tensor& labels, const Tensor& mask, int64_t vocab_begin,       \
      int64_t vocab_total, const Tensor& stats),                                                 \
     (logits, labels, mask, vocab_begin, vocab_total, stats))                                    \
  OP(void, cross_entropy_combine,                                                                \
     (const Tensor& partials, const Tensor& mask, const Tensor& lse, const Tensor& losses,        \
      float z_loss, float label_smoothing),                                                      \
     (partials, mask, lse, losses, z_loss, label_smoothing))                                     \
  OP(void, cross_entropy_grad,                                                                   \
     (const Tensor& logits, const Tensor& labels, const Tensor& mask, int64_t vocab_begin,       \
      const Tensor& lse, float grad_scale, float z_loss, float label_smoothing,                  \
      int64_t vocab_total),                                                                      \
     (logits, labels, mask, vocab_begin, lse, grad_scale, z_loss, label_smoothing, vocab_total)) \
  OP(void, distillation_loss,                                                                    \
     (const Tensor& logits, const Tensor& teacher, const Tensor& labels, const Tensor& mask,     \
      const ops::DistillParams& p, const Tensor& losses, const Tensor& distill_losses,           \
      bool with_grad, float grad_scale),                                                         \
     (logits, teacher, labels, mask, p, losses, distill_losses, with_grad, grad_scale))          \
  OP(void, distillation_partial,                                                                 \
     (const Tensor& logits, const Tensor& teacher, const Tensor& labels, const Tensor& mask,     \
      int64_t vocab_begin, int64_t vocab_total, const ops::DistillParams& p,                     \
      const Tensor& stats),                                                                      \
     (logits, teacher, labels, mask, vocab_begin, vocab_total, p, stats))                        \
  OP(void, distillation_combine,                                                                 \
     (const Tensor& partials, const Tensor& mask, const ops::DistillParams& p,                   \
      const Tensor& row_stats, const Tensor& losses, const Tensor& distill_losses),              \
     (partials, mask, p, row_stats, losses, distill_losses))                                     \
  OP(void, distillation_grad,                                                                    \
     (const Tensor& logits, const Tensor& teacher, const Tensor& labels, const Tensor& mask,     \
      int64_t vocab_begin, const ops::DistillParams& p, const Tensor& row_stats,                 \
      float grad_scale),                                                                         \
     (logits, teacher, labels, mask, vocab_begin, p, row_stats, grad_scale))

ENGINE_DECLARE_OPS(ENGINE_LOSS_OPS)
