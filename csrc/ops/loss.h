// Cross-entropy of next-token prediction over logits (T, V), fused with its gradient.
// For every row t with mask(t) != 0:
//   losses(t) = lse(logits_t) - logits_t[labels(t)]
//   with_grad: logits_t <- grad_scale * (softmax(logits_t) - onehot(labels(t)))  (in place)
// Masked rows get losses(t) = 0 and (with_grad) a zero gradient row. labels (T) i32 in [0, V)
// where the mask is set; mask (T) u8; losses (T) f32 (f64 when logits are f64). The caller sums
// losses and divides by the number of loss tokens in the global batch (grad_scale = 1 / that).
//
// Vocabulary-parallel cross-entropy: the same loss and gradient when each of P ranks holds the
// logits of a contiguous block of columns. logits (T, Vl) are the columns
// [vocab_begin, vocab_begin + Vl) of a vocabulary of vocab_total; labels (T) i32 and mask (T) u8
// are the full (replicated) ones. The "stat dtype" is f32 for bf16 or f32 logits, f64 for f64
// logits. Three steps, with an all-gather of the (3, T) stats between the first two:
//   cross_entropy_partial  stats (3, T):  per masked-in row t
//       stats[0][t] = m = max_v x_v          (-inf when Vl = 0)
//       stats[1][t] = s = sum_v exp(x_v - m)
//       stats[2][t] = z = x[label - vocab_begin] if the label is in this shard, else 0
//     masked rows: all three 0 (their labels are never read). A label outside [0, vocab_total)
//     at a masked-in row is an error naming the position and the label.
//   cross_entropy_combine  partials (P, 3, T): the P shards' stats stacked in shard order.
//     Per masked-in row: M = max_p m_p, S = sum_p s_p exp(m_p - M), lse(t) = M + log S,
//     losses(t) = lse - sum_p z_p; masked rows: lse = 0, losses = 0. lse, losses (T) in the stat
//     dtype. Fixed order over p: every rank combining the same partials gets the same bits.
//   cross_entropy_grad     in place on the shard's logits, per masked-in row:
//       x_v <- grad_scale * (exp(x_v - lse(t)) - [v + vocab_begin == label(t)])
//     masked rows become zero rows; lse (T) in the stat dtype (from combine). Labels outside the
//     shard match no column (partial has checked them).
// With P = 1 and vocab_begin = 0 the three compose to cross_entropy above. On CUDA lse is f32,
// so the gradient carries a relative error of about |lse| * 2^-24 on top of the kernel's own
// (6e-5 at |lse| = 1000; far below bf16 rounding), which the fused kernel avoids by keeping
// max and log-sum apart.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace engine::ops {

void cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                   const Tensor& losses, bool with_grad, float grad_scale);

// logits (T, Vl) are columns [vocab_begin, vocab_begin + Vl) of a vocabulary of vocab_total.
void cross_entropy_partial(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                           int64_t vocab_begin, int64_t vocab_total, const Tensor& stats);
void cross_entropy_combine(const Tensor& partials, const Tensor& mask, const Tensor& lse,
                           const Tensor& losses);
void cross_entropy_grad(const Tensor& logits, const Tensor& labels, const Tensor& mask,
                        int64_t vocab_begin, const Tensor& lse, float grad_scale);

}  // namespace engine::ops
