#include "data/varlen.h"

#include <algorithm>

#include "core/check.h"

namespace engine {

VarlenLayout build_varlen(const std::vector<const Sample*>& sequences, int sequence_length,
                          bool cross_document_attention) {
  VarlenLayout v;
  const int64_t total = static_cast<int64_t>(sequences.size()) * sequence_length;
  v.position_ids.reserve(static_cast<size_t>(total));
  v.segment.reserve(static_cast<size_t>(total));
  v.cu_seqlens.push_back(0);
  int32_t offset = 0;
  auto add_segment = [&](int32_t len) {
    const int32_t seg = static_cast<int32_t>(v.cu_seqlens.size()) - 1;
    for (int32_t p = 0; p < len; ++p) {
      v.position_ids.push_back(p);
      v.segment.push_back(seg);
    }
    offset += len;
    v.cu_seqlens.push_back(offset);
    v.max_seqlen = std::max(v.max_seqlen, len);
  };
  for (size_t s = 0; s < sequences.size(); ++s) {
    const Sample& sample = *sequences[s];
    int64_t covered = 0;
    for (int32_t len : sample.doc_lengths) {
      ENSURE(len > 0, "sequence ", s, ": document piece of length ", len);
      covered += len;
    }
    ENSURE_EQ(covered, int64_t{sequence_length}, "sequence ", s, ": document lengths must cover it");
    if (cross_document_attention) {
      // Padding still stays apart: it is the trailing piece when present.
      int32_t real = sequence_length - sample.padding;
      if (real > 0) add_segment(real);
      if (sample.padding > 0) add_segment(sample.padding);
    } else {
      for (int32_t len : sample.doc_lengths) add_segment(len);
    }
  }
  return v;
}

VarlenSlice slice_varlen(const VarlenLayout& v, int64_t begin, int64_t end) {
  const int64_t total = static_cast<int64_t>(v.position_ids.size());
  ENSURE(0 <= begin && begin <= end && end <= total, "slice [", begin, ", ", end, ") of ", total, " rows");
  VarlenSlice s;
  s.begin = begin;
  s.end = end;
  s.key_begin = begin;
  s.cu_seqlens_q.push_back(0);
  s.cu_seqlens_k.push_back(0);
  if (begin == end) return s;
  // Segments are sorted: find the one holding row `begin`, then walk forward.
  const auto first = std::upper_bound(v.cu_seqlens.begin(), v.cu_seqlens.end(), static_cast<int32_t>(begin)) - 1;
  s.key_begin = *first;
  for (auto it = first; it + 1 != v.cu_seqlens.end() && *it < end; ++it) {
    const int64_t seg_begin = *it, seg_end = *(it + 1);
    if (seg_end <= begin) continue;  // empty segments before the slice
    const int64_t q0 = std::max(seg_begin, begin), q1 = std::min(seg_end, end);
    const int32_t nq = static_cast<int32_t>(q1 - q0), nk = static_cast<int32_t>(q1 - seg_begin);
    s.cu_seqlens_q.push_back(s.cu_seqlens_q.back() + nq);
    s.cu_seqlens_k.push_back(static_cast<int32_t>(q1 - s.key_begin));
    s.max_seqlen_q = std::max(s.max_seqlen_q, nq);
    s.max_seqlen_k = std::max(s.max_seqlen_k, nk);
    const int32_t seg = static_cast<int32_t>(s.cu_seqlens_q.size()) - 2;
    for (int64_t r = q0; r < q1; ++r) s.segment.push_back(seg);
  }
  s.position_ids.assign(v.position_ids.begin() + begin, v.position_ids.begin() + end);
  return s;
}

}  // namespace engine
