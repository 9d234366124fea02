#include "models/micro_batch.h"

namespace engine {

namespace {
template <typename T>
Owned to_device(const std::vector<T>& v, Device device) {
  Owned o = empty({static_cast<int64_t>(v.size())}, dtype_of<T>(), device);
  copy_bytes(o.t.data, device, v.data(), Device::CPU, v.size() * sizeof(T));
  return o;
}
}  // namespace

MicroBatch make_micro_batch(const std::vector<const Sample*>& sequences, int sequence_length,
                            bool cross_document_attention, Device device) {
  const size_t S = static_cast<size_t>(sequence_length);
  std::vector<int32_t> tokens, labels;
  std::vector<uint8_t> mask;
  tokens.reserve(sequences.size() * S);
  labels.reserve(sequences.size() * S);
  mask.reserve(sequences.size() * S);
  MicroBatch mb;
  for (const Sample* s : sequences) {
    ENSURE(s->tokens.size() == S + 1 && s->loss_mask.size() == S, "sample of ", s->tokens.size(),
           " tokens / ", s->loss_mask.size(), " mask entries for sequence_length ", S);
    tokens.insert(tokens.end(), s->tokens.begin(), s->tokens.end() - 1);
    labels.insert(labels.end(), s->tokens.begin() + 1, s->tokens.end());
    mask.insert(mask.end(), s->loss_mask.begin(), s->loss_mask.end());
    for (uint8_t m : s->loss_mask) mb.loss_tokens += m != 0;
  }
  VarlenLayout v = build_varlen(sequences, sequence_length, cross_document_attention);
  mb.num_tokens = static_cast<int64_t>(tokens.size());
  mb.tokens = to_device(tokens, device);
  mb.labels = to_device(labels, device);
  mb.loss_mask = to_device(mask, device);
  mb.positions = to_device(v.position_ids, device);
  mb.cu_seqlens = to_device(v.cu_seqlens, device);
  mb.max_seqlen = v.max_seqlen;
  return mb;
}

}  // namespace engine
