// The embedding backward's steps 1 and 2 (embedding.cu's header describes them): the sort keys
// of the tokens and the stable LSD radix sort of (key, token) by key, device code included by
// embedding.cu only; and the programmatic-dependent-launch wait its kernels share.
#pragma once
#include <cstdint>

#include "cuda/common/launch.cuh"

namespace engine::cuda {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kSortTile = 1024;  // tokens per block of a radix pass (one per thread)
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 4;
constexpr int kShortSortTiles = 32;  // sorts of up to 32 tiles need no scan kernel

// The sort key of a token: its local id for ids of the shard, `rows` (sorted last, ignored) for
// other shards' ids and bad ones.
static __device__ __forceinline__ uint32_t sort_key(int32_t id, int64_t begin, int64_t rows,
                                                    int64_t vocab) {
  const int64_t local = static_cast<int64_t>(id) - begin;
  const bool mine = id >= 0 && id < vocab && local >= 0 && local < rows;
  return mine ? static_cast<uint32_t>(local) : static_cast<uint32_t>(rows);
}

// The backward's kernels are launched as programmatic dependents of the kernel ahead
// (launch_dependent, cuda/common/launch.cuh): their blocks may be resident before it finishes;
// each calls wait_for_previous_kernel() before it touches memory the kernel ahead writes. The
// first scatter reads the op's ids (and may record a bad one in the error flag) before its
// wait: the histogram kernel ahead lets it launch only after waiting for every earlier kernel,
// and neither kernel writes the ids or the flag.

// Where a pass's count of digit d in tile t lives: tile-major for short sorts (a scatter block
// reads all tiles' counts, neighbouring lanes neighbouring digits: whole sectors), digit-major for
// long ones (the scan kernel's order: the exclusive prefix is the scatter offset).
static __device__ __forceinline__ int64_t hist_index(bool tile_major, int d, int64_t t,
                                                     int64_t tiles) {
  return tile_major ? t * kDigits + d : d * tiles + t;
}

// The first pass's histogram, keys straight from the ids: hist[0][(d, tile)] = number of
// the tile's keys with low digit d. Also zeroes this tile's column of the later passes'
// histograms (their scatters add into them).
static __global__ void __launch_bounds__(kSortTile)
    radix_first_hist_kernel(const int32_t* ids, int64_t n, int64_t begin, int64_t rows,
                            int64_t vocab, int64_t tiles, int passes, bool tile_major, int* hist) {
  __shared__ int count[kDigits];
  wait_for_previous_kernel();  // and the first scatter may launch
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) count[d] = 0;
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  if (i < n) atomicAdd(&count[sort_key(ids[i], begin, rows, vocab) & (kDigits - 1)], 1);
  __syncthreads();
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) {
    hist[hist_index(tile_major, d, blockIdx.x, tiles)] = count[d];
    for (int q = 1; q < passes; ++q)
      hist[q * kDigits * tiles + hist_index(tile_major, d, blockIdx.x, tiles)] = 0;
  }
}

// The sum of v over lanes 0 .. lane of the warp (all 32 lanes take part).
static __device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// In-place exclusive prefix sum of data[0, n) by one block, kScanThreads x kScanItems at a time
// (the histograms of long sorts).
static __global__ void __launch_bounds__(kScanThreads) exclusive_scan_kernel(int* data, int64_t n) {
  wait_for_previous_kernel();
  __shared__ int warp_total[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int carry = 0;
  for (int64_t base = 0; base < n; base += kScanThreads * kScanItems) {
    const int64_t i0 = base + static_cast<int64_t>(threadIdx.x) * kScanItems;
    int v[kScanItems], sum = 0;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      v[j] = i0 + j < n ? data[i0 + j] : 0;
      sum += v[j];
    }
    const int incl = warp_inclusive_sum(sum, lane);
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      warp_total[lane] = warp_inclusive_sum(warp_total[lane], lane);  // inclusive over warps
    }
    __syncthreads();
    int run = carry + (warp > 0 ? warp_total[warp - 1] : 0) + incl - sum;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      if (i0 + j < n) data[i0 + j] = run;
      run += v[j];
    }
    carry += warp_total[kScanThreads / 32 - 1];
    __syncthreads();  // warp_total is rewritten by the next chunk
  }
}

struct SortPass {
  const uint32_t* keys_in;  // nullptr: the first pass, keys from ids and values = positions
  const int32_t* vals_in;
  const int32_t* ids;
  uint32_t* keys_out;
  int32_t* vals_out;
  const int* hist;  // this pass's counts [digit][tile]; long sorts: their exclusive scan
  int* next_hist;   // the next pass's counts, added here (nullptr: the last pass)
  int* err;         // the first pass: the first bad token position (nullptr: not checked)
  int64_t n, tiles, begin, rows, vocab;
  int shift;
};

// Stable scatter of one tile by the digit at `shift`; the tile's offset of digit d is the number
// of keys with a smaller digit plus those with digit d in earlier tiles. hist holds the pass's
// counts [digit][tile]:
//   kCountsRead (short sorts, up to kShortSortTiles tiles): the raw counts; the block reads all
//   of them at once (thread (group g of 4, digit d): the digit's tiles g, g + 4, ...), adds the
//   tiles before its own and all of them per digit, and scans the 256 totals itself.
//   kScanned (longer sorts): their exclusive scan over (digit, tile), from the scan kernel.
// A pass that is not the last counts each key into the next pass's histogram at the tile of its
// output position (integer atomics: the same counts in any order). Within the tile, lanes rank
// by __match_any_sync and warps by a per-warp digit table (scanned over the warps by 4 groups of
// 256 threads).
enum SortMode { kScanned = 0, kCountsRead = 1 };
template <int kMode>
static __global__ void __launch_bounds__(kSortTile) radix_scatter_kernel(const SortPass p) {
  constexpr int kWarps = kSortTile / 32;
  constexpr int kGroups = kSortTile / kDigits, kPerGroup = kShortSortTiles / kGroups;
  __shared__ int warp_count[kWarps][kDigits];  // count, then exclusive prefix over the warps
  __shared__ int base[kDigits];
  __shared__ int split[2][kDigits];  // kCountsRead: keys per digit before this tile / from it on
  __shared__ int digit_warp_total[kDigits / 32];
  __shared__ int group_total[kGroups][kDigits];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  const bool valid = i < p.n;
  // The first pass's keys come from the op's ids, not from the kernel ahead: they are read
  // before waiting for it (the histogram kernel).
  uint32_t key = 0u;
  int32_t val = 0;
  if (!p.keys_in && valid) {
    const int32_t id = p.ids[i];
    key = sort_key(id, p.begin, p.rows, p.vocab);
    val = static_cast<int32_t>(i);
    if ((id < 0 || id >= p.vocab) && p.err) atomicMin(p.err, static_cast<int>(i));
  }
  wait_for_previous_kernel();
  if (p.keys_in && valid) {
    key = p.keys_in[i];
    val = p.vals_in[i];
  }
  // kCountsRead: thread (group, digit) loads the digit's counts of tiles group + kGroups k.
  const int group = static_cast<int>(threadIdx.x) / kDigits, group_digit = threadIdx.x % kDigits;
  int counts[kPerGroup];
  if constexpr (kMode == kCountsRead) {
#pragma unroll
    for (int k = 0; k < kPerGroup; ++k) {
      const int t = group + kGroups * k;
      counts[k] = t < p.tiles ? p.hist[hist_index(true, group_digit, t, p.tiles)] : 0;
    }
  }
  for (int k = threadIdx.x; k < kWarps * kDigits; k += kSortTile) (&warp_count[0][0])[k] = 0;
  if constexpr (kMode == kCountsRead) {
    for (int k = threadIdx.x; k < 2 * kDigits; k += kSortTile) (&split[0][0])[k] = 0;
    __syncthreads();
    int before = 0, after = 0;
#pragma unroll
    for (int k = 0; k < kPerGroup; ++k)
      (group + kGroups * k < static_cast<int>(blockIdx.x) ? before : after) += counts[k];
    atomicAdd(&split[0][group_digit], before);
    atomicAdd(&split[1][group_digit], after);
  }
  __syncthreads();
  if (threadIdx.x < kDigits) {
    const int d = threadIdx.x;
    if constexpr (kMode == kCountsRead) {
      const int before = split[0][d], total = before + split[1][d];
      // Exclusive scan of the digit totals: within each warp of digits, then over the warps.
      const int incl = warp_inclusive_sum(total, lane);
      if (lane == 31) digit_warp_total[warp] = incl;
      base[d] = incl - total + before;  // the warp's carry is added below
    } else {
      base[d] = p.hist[d * p.tiles + blockIdx.x];
    }
  }
  const int digit = valid ? static_cast<int>((key >> p.shift) & (kDigits - 1)) : kDigits;
  const unsigned peers = __match_any_sync(kFull, digit);  // lanes of this warp with this digit
  const unsigned lower = peers & ((1u << lane) - 1u);
  if (valid && lower == 0) warp_count[warp][digit] = __popc(peers);
  __syncthreads();
  if constexpr (kMode == kCountsRead) {
    if (threadIdx.x < kDigits) {
      int carry = 0;
      for (int w = 0; w < warp; ++w) carry += digit_warp_total[w];
      base[threadIdx.x] += carry;
    }
  }
  {  // Exclusive prefix of each digit's counts over the warps: thread (group, digit) scans the
     // group's kWarps / kGroups warps; the groups' totals are added in below.
    int run = 0;
#pragma unroll
    for (int w = group * (kWarps / kGroups); w < (group + 1) * (kWarps / kGroups); ++w) {
      const int c = warp_count[w][group_digit];
      warp_count[w][group_digit] = run;
      run += c;
    }
    group_total[group][group_digit] = run;
  }
  __syncthreads();
  // The key's rank among this tile's keys of its digit.
  int rank = 0;
  if (valid) {
    rank = warp_count[warp][digit] + __popc(lower);
    for (int g = 0; g < warp / (kWarps / kGroups); ++g) rank += group_total[g][digit];
  }
  // The tile's keys are staged in shared memory in digit order (local_off: the exclusive prefix
  // of the tile's digit counts), then written out by consecutive threads, so a digit's keys go
  // out as one contiguous piece instead of one scattered word per thread.
  __shared__ int local_off[kDigits], local_warp_total[kDigits / 32];
  if (threadIdx.x < kDigits) {
    int total = 0;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) total += group_total[g][threadIdx.x];
    const int incl = warp_inclusive_sum(total, lane);
    if (lane == 31) local_warp_total[warp] = incl;
    local_off[threadIdx.x] = incl - total;
  }
  __syncthreads();
  if (threadIdx.x < kDigits)
    for (int w = 0; w < warp; ++w) local_off[threadIdx.x] += local_warp_total[w];
  __syncthreads();
  // warp_count is read above for the last time: its first 2 kSortTile words hold the staging.
  uint32_t* stage_key = reinterpret_cast<uint32_t*>(&warp_count[0][0]);
  int32_t* stage_val = &warp_count[0][0] + kSortTile;
  static_assert(2 * kSortTile <= kWarps * kDigits, "staging fits in warp_count");
  if (valid) {
    stage_key[local_off[digit] + rank] = key;
    stage_val[local_off[digit] + rank] = val;
  }
  __syncthreads();
  const int64_t tile_n = std::min<int64_t>(kSortTile, p.n - static_cast<int64_t>(blockIdx.x) * kSortTile);
  if (threadIdx.x < tile_n) {
    const uint32_t k = stage_key[threadIdx.x];
    const int d = static_cast<int>((k >> p.shift) & (kDigits - 1));
    const int pos = base[d] + static_cast<int>(threadIdx.x) - local_off[d];
    p.keys_out[pos] = k;
    p.vals_out[pos] = stage_val[threadIdx.x];
    if (p.next_hist) {
      const int next = static_cast<int>((k >> (p.shift + kDigitBits)) & (kDigits - 1));
      atomicAdd(&p.next_hist[hist_index(kMode == kCountsRead, next, pos / kSortTile, p.tiles)], 1);
    }
  }
}

}  // namespace engine::cuda
