#include "data/dataset_sampler.h"

#include <algorithm>

#include "data/permutation.h"

namespace engine {

DatasetSampler::DatasetSampler(SplitDocuments docs, const SamplingParams& params, int64_t num_samples)
    : docs_(std::move(docs)), p_(params) {
  const int64_t S = p_.sequence_length;
  ENSURE(S > 0, "data.sequence_length must be positive, got ", S);
  ENSURE(num_samples >= 0, "num_samples must be >= 0, got ", num_samples);
  order_key_ = philox_key(p_.seed, p_.key_name + "/documents");
  shuffle_key_ = philox_key(p_.seed, p_.key_name + "/samples");
  const TokenDataset& ds = *docs_.dataset;
  for (int64_t k = 0; k < docs_.size(); ++k) {
    int64_t size = ds.document_size(docs_[k]);
    split_tokens_ += size;
    if (size > S + 1) ++too_long_;
    else fitting_tokens_ += size;
  }
  ENSURE(split_tokens_ > 0, ds.path(), ": no tokens in this split (", docs_.size(), " documents)");
  ENSURE(p_.truncate_documents || fitting_tokens_ > 0, ds.path(), ": none of its ", docs_.size(),
         " documents fits in sequence_length + 1 = ", S + 1,
         " tokens (truncate_documents = false keeps documents whole)");
  // About one epoch of samples per shuffle block: a small (validation) set is not repeated
  // within the first samples, a large one still mixes far-apart documents in each batch.
  int64_t per_epoch = p_.truncate_documents ? split_tokens_ / S : fitting_tokens_ / (S + 1);
  block_ = std::clamp<int64_t>(per_epoch, 1, kShuffleBlock);
  planned_ = (num_samples + block_ - 1) / block_ * block_;
  if (p_.truncate_documents) plan_truncated(planned_);
  else plan_packed(planned_);
}

int64_t DatasetSampler::stream_document(int64_t g) const {
  const uint64_t n = static_cast<uint64_t>(docs_.size());
  const uint64_t epoch = static_cast<uint64_t>(g) / n, pos = static_cast<uint64_t>(g) % n;
  return docs_[static_cast<int64_t>(IndexPermutation(order_key_, n, epoch)(pos))];
}

void DatasetSampler::plan_truncated(int64_t count) {
  const TokenDataset& ds = *docs_.dataset;
  const int64_t S = p_.sequence_length;
  start_.reserve(static_cast<size_t>(count));
  start_offset_.reserve(static_cast<size_t>(count));
  int64_t g = 0, offset = 0;
  int64_t size = count > 0 ? ds.document_size(stream_document(0)) : 0;
  for (int64_t k = 0; k < count; ++k) {
    // Normalise to a position inside a non-empty document.
    while (offset == size) {
      ++g;
      offset = 0;
      size = ds.document_size(stream_document(g));
    }
    ENSURE(offset <= INT32_MAX, ds.path(), ": document ", stream_document(g), " is too long");
    start_.push_back(g);
    start_offset_.push_back(static_cast<int32_t>(offset));
    for (int64_t left = S; left > 0;) {
      int64_t take = std::min(left, size - offset);
      left -= take;
      offset += take;
      if (left > 0) {
        ++g;
        offset = 0;
        size = ds.document_size(stream_document(g));
      }
    }
  }
}

void DatasetSampler::plan_packed(int64_t count) {
  const TokenDataset& ds = *docs_.dataset;
  const int64_t cap = p_.sequence_length + 1;
  start_.reserve(static_cast<size_t>(count) + 1);
  int64_t g = 0;
  for (int64_t k = 0; k < count; ++k) {
    int64_t fill = 0;
    // Skip leading documents that cannot be placed, so that each start is a placed document.
    while (true) {
      int64_t size = ds.document_size(stream_document(g));
      if (size > 0 && size <= cap) break;
      ++g;
    }
    start_.push_back(g);
    while (true) {
      int64_t size = ds.document_size(stream_document(g));
      if (size == 0 || size > cap) {
        ++g;
        continue;
      }
      if (fill + size > cap) break;
      fill += size;
      ++g;
    }
  }
  start_.push_back(g);
}

double DatasetSampler::epochs() const {
  if (start_.empty()) return 0;
  int64_t end = p_.truncate_documents ? start_.back() + 1 : start_.back();
  return static_cast<double>(end) / static_cast<double>(docs_.size());
}

double DatasetSampler::epochs_for(int64_t samples) const {
  samples = std::clamp<int64_t>(samples, 0, planned_);
  if (samples == 0) return 0;
  if (p_.truncate_documents)
    return static_cast<double>(samples * p_.sequence_length + 1) / static_cast<double>(split_tokens_);
  return static_cast<double>(start_[static_cast<size_t>(samples)]) / static_cast<double>(docs_.size());
}

void DatasetSampler::put_piece(int64_t doc, int64_t offset, int64_t count, int64_t pos,
                               Sample* out) const {
  const TokenDataset& ds = *docs_.dataset;
  int32_t* t = out->tokens.data() + pos;
  ds.read(doc, offset, count, t);
  for (int64_t i = 0; i < count; ++i)
    if (t[i] >= p_.vocab_size)
      RAISE("dataset ", ds.path(), ": document ", doc, ", token offset ", offset + i, ": token id ",
            t[i], " >= model.vocab_size (", p_.vocab_size, ")");
  if (!ds.has_loss_masking_spans()) return;
  for (const TokenSpan& s : ds.loss_masking_spans(doc)) {
    int64_t b = std::max(s.begin, offset), e = std::min(s.end, offset + count);
    for (int64_t x = b; x < e; ++x) {
      int64_t at = pos + (x - offset);  // sample position of a masked token: label of at - 1
      if (at >= 1) out->loss_mask[static_cast<size_t>(at - 1)] = 0;
    }
  }
}

void DatasetSampler::fill(int64_t j, Sample* out) const {
  ENSURE(j >= 0 && j < planned_, "sample ", j, " out of the planned range [0, ", planned_, ")");
  const TokenDataset& ds = *docs_.dataset;
  const int64_t S = p_.sequence_length;
  const int64_t block = j / block_;
  const int64_t q = block * block_ +
                    static_cast<int64_t>(IndexPermutation(shuffle_key_, static_cast<uint64_t>(block_),
                                                          static_cast<uint64_t>(block))(
                        static_cast<uint64_t>(j % block_)));
  out->tokens.assign(static_cast<size_t>(S + 1), 0);
  out->loss_mask.assign(static_cast<size_t>(S), 1);
  out->doc_lengths.clear();
  out->padding = 0;
  int64_t pos = 0;
  if (p_.truncate_documents) {
    int64_t g = start_[static_cast<size_t>(q)], offset = start_offset_[static_cast<size_t>(q)];
    while (pos < S + 1) {
      int64_t doc = stream_document(g);
      int64_t take = std::min(ds.document_size(doc) - offset, S + 1 - pos);
      if (take > 0) {
        put_piece(doc, offset, take, pos, out);
        if (int64_t in = std::min(pos + take, S) - pos; in > 0)
          out->doc_lengths.push_back(static_cast<int32_t>(in));
        pos += take;
      }
      ++g;
      offset = 0;
    }
    return;
  }
  const int64_t end = start_[static_cast<size_t>(q) + 1];
  for (int64_t g = start_[static_cast<size_t>(q)]; g < end; ++g) {
    int64_t doc = stream_document(g);
    int64_t size = ds.document_size(doc);
    if (size == 0 || size > S + 1) continue;
    put_piece(doc, 0, size, pos, out);
    if (int64_t in = std::min(pos + size, S) - pos; in > 0)
      out->doc_lengths.push_back(static_cast<int32_t>(in));
    pos += size;
  }
  // pos real tokens; labels from position pos - 1 on are padding.
  for (int64_t i = std::max<int64_t>(pos - 1, 0); i < S; ++i) out->loss_mask[static_cast<size_t>(i)] = 0;
  if (pos < S) {
    out->padding = static_cast<int32_t>(S - pos);
    out->doc_lengths.push_back(out->padding);
  }
}

}  // namespace engine
