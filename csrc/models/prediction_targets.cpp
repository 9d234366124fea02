#include "models/prediction_targets.h"

#include "core/check.h"

namespace engine {

void prediction_targets(const Sample& s, int j, std::vector<int32_t>& labels, std::vector<uint8_t>& mask) {
  ENSURE(j >= 1, "prediction_targets: head ", j, " (head 0 is the sample's own labels)");
  const int64_t S = static_cast<int64_t>(s.loss_mask.size());
  ENSURE(static_cast<int64_t>(s.tokens.size()) == S + 1, "sample of ", s.tokens.size(), " tokens for ", S,
         " mask entries");
  // The document piece of each input position.
  std::vector<int32_t> piece(static_cast<size_t>(S), -1);
  int64_t at = 0;
  for (size_t p = 0; p < s.doc_lengths.size(); ++p)
    for (int32_t i = 0; i < s.doc_lengths[p] && at < S; ++i) piece[static_cast<size_t>(at++)] = static_cast<int32_t>(p);
  ENSURE(at == S, "sample: document pieces cover ", at, " of ", S, " positions");
  labels.assign(static_cast<size_t>(S), 0);
  mask.assign(static_cast<size_t>(S), 0);
  for (int64_t t = 0; t + 1 + j < S; ++t) {
    const size_t u = static_cast<size_t>(t + 1 + j);
    if (piece[u] != piece[static_cast<size_t>(t)] || s.loss_mask[static_cast<size_t>(t + j)] == 0) continue;
    labels[static_cast<size_t>(t)] = s.tokens[u];
    mask[static_cast<size_t>(t)] = 1;
  }
}

int64_t prediction_loss_tokens(const Sample& s, int j) {
  int64_t n = 0;
  if (j == 0) {
    for (uint8_t m : s.loss_mask) n += m != 0;
    return n;
  }
  std::vector<int32_t> labels;
  std::vector<uint8_t> mask;
  prediction_targets(s, j, labels, mask);
  for (uint8_t m : mask) n += m;
  return n;
}

}  // namespace engine
