// Vector access for the kernel files (.cu only). A pack is N consecutive elements of T moved as
// whole aligned units of min(16, N * sizeof(T)) bytes (one 2- to 16-byte access, or several
// 16-byte ones for 32-byte vectors), converted to and from f32 registers (bf16 stores round to
// nearest even). The address must be aligned to that unit; launchers check it with aligned16
// (packs of 16 bytes) or peel a head first (vector_head).
// Flat ops whose operands may start anywhere peel `head` leading elements so that every pointer
// of the op is aligned for its vectors from element `head` on; the kernel does the tail one by
// one too. When the pointers disagree on their misalignment no common head exists and
// everything runs element by element:
//   head:  [0, head)                 scalar
//   body:  [head, head + nvec * E)   vectors of E (nvec = (n - head) / E)
//   tail:  [head + nvec * E, n)      scalar
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "cuda/common/launch.cuh"

namespace engine::cuda {

// N elements of T as one aligned unit of N * sizeof(T) bytes (a power of two, at most 16 for
// a single access).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements of T per access of an N-element vector: the whole vector up to 16 bytes.
template <typename T, int N>
constexpr int kPackUnit = N * sizeof(T) <= 16 ? N : 16 / static_cast<int>(sizeof(T));

// A pack held in registers, as floats.
template <typename T, int N>
__device__ __forceinline__ void unpack(const Pack<T, N>& pk, float (&out)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = to_float(pk.v[j]);
}

// N elements of T at p, as floats; p aligned to kPackUnit<T, N> * sizeof(T) bytes.
template <typename T, int N>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[N]) {
  constexpr int U = kPackUnit<T, N>;
  static_assert(N % U == 0, "a vector is a whole number of 16-byte units");
  using P = Pack<T, U>;
#pragma unroll
  for (int c = 0; c < N / U; ++c) {
    const P u = reinterpret_cast<const P*>(p)[c];
#pragma unroll
    for (int j = 0; j < U; ++j) out[c * U + j] = to_float(u.v[j]);
  }
}

// Stores N floats converted to T at p, aligned as for load_pack.
template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const float (&in)[N]) {
  constexpr int U = kPackUnit<T, N>;
  static_assert(N % U == 0, "a vector is a whole number of 16-byte units");
  using P = Pack<T, U>;
#pragma unroll
  for (int c = 0; c < N / U; ++c) {
    P u;
#pragma unroll
    for (int j = 0; j < U; ++j) u.v[j] = from_float<T>(in[c * U + j]);
    reinterpret_cast<P*>(p)[c] = u;
  }
}

// ---- host side ------------------------------------------------------------------------------

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One pointer of an op and the size of its elements (null pointers are ignored).
struct VecPtr {
  const void* p;
  size_t elem;
};

// The number of leading elements to peel so that, from there on, every pointer is aligned for
// E-element vectors (min(16, E * elem) bytes). n when the pointers admit no common head.
inline int64_t vector_head(std::initializer_list<VecPtr> ptrs, int E, int64_t n) {
  for (int h = 0; h < E; ++h) {
    bool ok = true;
    for (const VecPtr& q : ptrs) {
      if (!q.p) continue;
      const size_t align = std::min<size_t>(16, static_cast<size_t>(E) * q.elem);
      ok = ok && (reinterpret_cast<uintptr_t>(q.p) + static_cast<uintptr_t>(h) * q.elem) % align == 0;
    }
    if (ok) return std::min<int64_t>(h, n);
  }
  return n;
}

// Work items of a grid-stride loop over n elements with `head` peeled for E-element vectors:
// the vectors (at least one item, so that the head and tail get threads), or n elements when
// everything runs element by element (head == n).
inline int64_t vector_items(int64_t n, int64_t head, int E) {
  return head == n ? n : std::max<int64_t>((n - head) / E, 1);
}

}  // namespace engine::cuda
