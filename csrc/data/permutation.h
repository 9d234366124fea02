// A seeded pseudo-random permutation of [0, n) evaluated one element at a time, in O(1) memory:
// a balanced Feistel network on the smallest domain of 2^(2h) >= n elements (round function:
// Philox keyed by `key`, counter = (round, right half), `stream` separating epochs or blocks),
// with cycle walking to stay inside [0, n). The domain is < 4n, so a lookup takes fewer than 4
// network passes on average. Used for document orders per epoch, sample shuffles and the
// validation split, so that a sample never needs a materialised permutation.
#pragma once
#include <bit>
#include <cstdint>

#include "core/check.h"
#include "core/rng.h"

namespace engine {

class IndexPermutation {
 public:
  IndexPermutation(PhiloxKey key, uint64_t n, uint64_t stream = 0) : key_(key), n_(n), stream_(stream) {
    int bits = n > 1 ? std::bit_width(n - 1) : 1;
    half_bits_ = (bits + 1) / 2;
    mask_ = (uint64_t{1} << half_bits_) - 1;
  }

  uint64_t size() const { return n_; }

  // The image of i (0 <= i < n).
  uint64_t operator()(uint64_t i) const {
    ENSURE(i < n_, "permutation index ", i, " out of range [0, ", n_, ")");
    uint64_t x = i;
    do x = encrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  static constexpr int kRounds = 4;  // Luby-Rackoff: 4 rounds for a strong pseudo-random permutation

  uint64_t encrypt(uint64_t x) const {
    uint64_t left = x >> half_bits_, right = x & mask_;
    for (uint64_t r = 0; r < kRounds; ++r) {
      uint64_t f = philox4x32(key_, (r << 32) | right, stream_).v[0] & mask_;
      uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  PhiloxKey key_;
  uint64_t n_;
  uint64_t stream_;
  int half_bits_ = 1;
  uint64_t mask_ = 1;
};

}  // namespace engine
