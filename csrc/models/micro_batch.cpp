#include "models/micro_batch.h"

#include "core/rng.h"
#include "models/prediction_targets.h"

namespace engine {

namespace {
// The host vector to `device` without waiting for the GPU (upload_bytes): a micro-batch's
// uploads queue behind the previous step's kernels instead of draining the stream (the profile
// of a GPT-2 step on an H200 showed the GPU idle 3 ms of its 60 before the synchronous uploads).
template <typename T>
Owned to_device(const std::vector<T>& v, Device device) {
  Owned o = empty({static_cast<int64_t>(v.size())}, dtype_of<T>(), device);
  upload_bytes(o.t.data, device, v.data(), v.size() * sizeof(T));
  return o;
}
}  // namespace

MicroBatch make_micro_batch(const std::vector<const Sample*>& sequences, int sequence_length,
                            bool cross_document_attention, Device device, int prediction_heads) {
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
  for (int j = 1; j <= prediction_heads; ++j) {
    std::vector<int32_t> head_labels, sample_labels;
    std::vector<uint8_t> head_mask, sample_mask;
    int64_t n = 0;
    for (const Sample* s : sequences) {
      prediction_targets(*s, j, sample_labels, sample_mask);
      head_labels.insert(head_labels.end(), sample_labels.begin(), sample_labels.end());
      head_mask.insert(head_mask.end(), sample_mask.begin(), sample_mask.end());
      for (uint8_t m : sample_mask) n += m;
    }
    mb.mtp_labels.push_back(to_device(head_labels, device));
    mb.mtp_mask.push_back(to_device(head_mask, device));
    mb.mtp_loss_tokens.push_back(n);
  }
  return mb;
}

std::vector<MicroBatch> make_micro_sequences(const std::vector<const Sample*>& sequences, int sequence_length,
                                             bool cross_document_attention, Device device, int64_t chunk_rows,
                                             int prediction_heads) {
  const int64_t T = static_cast<int64_t>(sequences.size()) * sequence_length;
  std::vector<MicroBatch> out;
  if (chunk_rows <= 0 || chunk_rows >= T) {
    out.push_back(make_micro_batch(sequences, sequence_length, cross_document_attention, device, prediction_heads));
    return out;
  }
  ENSURE(T % chunk_rows == 0, "micro-sequences of ", chunk_rows, " rows do not divide the micro-batch's ", T);
  MicroBatch whole =
      make_micro_batch(sequences, sequence_length, cross_document_attention, Device::CPU, prediction_heads);
  const VarlenLayout v = build_varlen(sequences, sequence_length, cross_document_attention);
  auto kv = std::make_shared<layers::KvChunks>();
  kv->rows = T;
  const int chunks = static_cast<int>(T / chunk_rows);
  auto rows_of = [&](const Owned& t, int64_t b, int64_t e) {
    Owned o = empty({e - b}, t.t.dtype, device);
    copy_tensor(o, t->slice(b, e));
    return o;
  };
  for (int c = 0; c < chunks; ++c) {
    const int64_t b = c * chunk_rows, e = b + chunk_rows;
    const VarlenSlice sl = slice_varlen(v, b, e);
    MicroBatch mb;
    mb.tokens = rows_of(whole.tokens, b, e);
    mb.labels = rows_of(whole.labels, b, e);
    mb.loss_mask = rows_of(whole.loss_mask, b, e);
    mb.positions = to_device(sl.position_ids, device);
    mb.cu_seqlens = to_device(sl.cu_seqlens_q, device);
    mb.cu_seqlens_k = to_device(sl.cu_seqlens_k, device);
    mb.max_seqlen = sl.max_seqlen_q;
    mb.max_seqlen_k = sl.max_seqlen_k;
    mb.num_tokens = chunk_rows;
    const uint8_t* m = whole.loss_mask->ptr<uint8_t>();
    for (int64_t i = b; i < e; ++i) mb.loss_tokens += m[i] != 0;
    for (size_t h = 0; h < whole.mtp_mask.size(); ++h) {
      mb.mtp_labels.push_back(rows_of(whole.mtp_labels[h], b, e));
      mb.mtp_mask.push_back(rows_of(whole.mtp_mask[h], b, e));
      const uint8_t* hm = whole.mtp_mask[h]->ptr<uint8_t>();
      int64_t n = 0;
      for (int64_t i = b; i < e; ++i) n += hm[i] != 0;
      mb.mtp_loss_tokens.push_back(n);
    }
    mb.chunk = c;
    mb.chunks = chunks;
    mb.row_begin = b;
    mb.key_begin = sl.key_begin;
    mb.kv = kv;
    out.push_back(std::move(mb));
  }
  return out;
}

uint64_t router_jitter_seed(uint64_t seed, int64_t first_sample, int chunk) {
  const uint64_t sample = static_cast<uint64_t>(first_sample);
  return splitmix64(seed ^ splitmix64(sample * 1024 + static_cast<uint64_t>(chunk))) | 1;
}

}  // namespace engine
