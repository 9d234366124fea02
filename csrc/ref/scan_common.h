// Helpers of the Mamba and Mamba-2 reference ops (ref/mamba.cpp, ref/ssd.cpp): the documents of
// a packed batch, the scalar activations in the op's precision, column-block element access.
#pragma once
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops/mamba.h"
#include "ref/common.h"

namespace engine::ref::scan {

using ops::ColumnBlock;

// Document starts as [begin, end) pairs; checks the offsets (shape checked before) describe T
// tokens.
inline std::vector<std::pair<int64_t, int64_t>> documents(const Tensor& cu_seqlens, int64_t tokens,
                                                          const char* op) {
  const int32_t* cu = cu_seqlens.ptr<int32_t>();
  const int64_t s = cu_seqlens.numel() - 1;
  ENSURE(cu[0] == 0 && cu[s] == tokens, op, ": cu_seqlens must run from 0 to T = ", tokens,
         ", got ", cu[0], " .. ", cu[s]);
  std::vector<std::pair<int64_t, int64_t>> docs;
  for (int64_t i = 0; i < s; ++i) {
    ENSURE(cu[i] <= cu[i + 1], op, ": cu_seqlens decreases at ", i + 1);
    if (cu[i] < cu[i + 1]) docs.emplace_back(cu[i], cu[i + 1]);
  }
  return docs;
}

template <typename T> T sigmoid(T v) { return T(1) / (T(1) + std::exp(-v)); }
template <typename T> T silu(T v) { return v * sigmoid(v); }
template <typename T> T dsilu(T v) {  // d silu / dv
  const T s = sigmoid(v);
  return s * (T(1) + v * (T(1) - s));
}
template <typename T> T softplus(T v) {  // log(1 + e^v) without overflow
  return v > T(0) ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
}

// Element (t, j) of a block.
template <typename T> T& at(const ColumnBlock& b, int64_t t, int64_t j) {
  return static_cast<T*>(b.base.data)[t * b.ld() + b.col + j];
}

}  // namespace engine::ref::scan
