// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11). A value is a pure function
// of (key, counter): no state advances, so any rank can generate exactly the elements it owns.
// Parameter init keys by (seed, parameter name) and counts by the element's index in the full
// (unsharded) tensor, which makes a tensor-parallel shard bitwise equal to its slice of the
// single-rank tensor. Data shuffling keys by (seed, purpose) and counts by position.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define ENGINE_HD __host__ __device__
#else
#define ENGINE_HD
#endif

namespace engine {

struct PhiloxKey {
  uint32_t k0 = 0, k1 = 0;
};

ENGINE_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Key from a seed and a name (FNV-1a of the name, mixed with the seed).
inline PhiloxKey philox_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  uint64_t k = splitmix64(seed ^ splitmix64(h));
  return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

struct Philox4 {
  uint32_t v[4];
};

// Philox4x32 with 10 rounds on counter (counter_lo, counter_hi, stream_lo, stream_hi).
ENGINE_HD inline Philox4 philox4x32(PhiloxKey key, uint64_t counter, uint64_t stream = 0) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in (0, 1] from 32 random bits.
ENGINE_HD inline double bits_to_unit(uint32_t x) { return (static_cast<double>(x) + 1.0) * 0x1p-32; }

// Standard normal for element `index` under `key` (Box-Muller on the first two words).
ENGINE_HD inline double philox_normal(PhiloxKey key, uint64_t index, uint64_t stream = 0) {
  Philox4 r = philox4x32(key, index, stream);
  double u1 = bits_to_unit(r.v[0]), u2 = bits_to_unit(r.v[1]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
}

// Uniform 64-bit value for element `index`.
ENGINE_HD inline uint64_t philox_u64(PhiloxKey key, uint64_t index, uint64_t stream = 0) {
  Philox4 r = philox4x32(key, index, stream);
  return (static_cast<uint64_t>(r.v[1]) << 32) | r.v[0];
}

// Uniform integer in [0, n) for element `index` (n > 0; 128-bit multiply, negligible bias).
inline uint64_t philox_below(PhiloxKey key, uint64_t index, uint64_t n, uint64_t stream = 0) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(philox_u64(key, index, stream)) * n) >> 64);
}

}  // namespace engine
