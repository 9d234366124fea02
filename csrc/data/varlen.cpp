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

}  // namespace engine
