// Embedding lookups over a table of R rows holding ids [B, B + R) of a vocabulary of V ids
// (unsharded: B = 0, R = V); ids (T) i32 in [0, V), local id l(t) = ids(t) - B:
//   forward:  out(t) = table(l(t)) for l(t) in [0, R), else a zero row    (accumulate:
//             out(t) += table(l(t)), f32 add, one rounding; rows of other shards untouched)
//   backward: dtable(l) += sum_{t : l(t) = l} dout(t), f32, the rows of one id in token order;
//             tokens of other shards add nothing
// Forward: persistent grid, a row per block at a time, up to 4 16-byte packs per thread in flight.
// Backward, deterministic without float atomics:
//   1. Keys: key(t) = l(t) (R for an invalid id or another shard's, which sorts last and is
//      then ignored), value t; computed from the ids by the first pass's kernels.
//   2. Stable LSD radix sort of (key, t) by key, 8 bits a pass over bit_width(R) bits. The first
//      pass's per-tile digit histogram (kSortTile tokens a tile) comes from its own kernel; each
//      pass's scatter counts its outputs into the next pass's histogram (integer atomics at the
//      output's tile). A scatter takes a tile's offsets from the exclusive scan over (digit,
//      tile): up to kFusedScanTiles tiles it sums them itself, beyond by a scan kernel first; it
//      ranks within a warp by __match_any_sync and across the warps of the tile by a per-warp
//      digit table. Afterwards each id's tokens are contiguous, in token order.
//   3. Cells: the sorted list is cut into cells of kCell entries, a block per (cell, chunk of
//      columns). A block walks its cell's entries in order with kCellUnroll dout rows in flight
//      per thread, summing each piece (a run of one key cut at the cell's edges). A piece that is
//      a whole run (all tokens of its id) adds its sum into dtable itself; a run spanning several
//      cells leaves one partial sum per cell in scratch (slot_own: the cell where the run starts;
//      slot_in: each later cell), and a fix-up kernel, one warp per owning cell and 32 packs of
//      columns, adds them in cell order into dtable.
//   Every sum has a fixed order, so dtable gets the same bits on every run with the same ids.
//   Kernels: first histogram, one scatter per pass (+ a scan each past 64 tiles), cells, fix-up.
//   Measured (one H200, T = 16384, V = 32000, bf16 dout; docs/PERF.md): 0.107 ms at C = 2048
//   (61% of copy on the bytes the op must move), 0.185 ms at C = 4096 (70%); the cells kernel
//   ~77 us of the first (84% of copy), the sort and fix-up ~21 us. The cells kernel replaced one
//   warp per piece (the column chunks the slowest grid dimension, so a row's 512-byte pieces
//   were read far apart in time: 120 us). Cells of 32 entries and 4 in flight per thread (87
//   registers, 5 blocks per SM) measured faster than 64 / 8 (spills under the register cap),
//   32 / 8, 16 / 8 and 32 / 4 at 6 blocks per SM; launching the chain with programmatic
//   dependent launch measured no difference and was left out.
// Invalid ids: the forward kernel and the sort's first histogram record the first bad position
// with an integer atomicMin into a device flag; the launcher reads the flag back after its
// kernels and raises naming the position and the id (as the CPU reference does). Forward gives
// bad ids a zero row (= ; += leaves the row untouched); backward adds nothing for them. Callers
// that checked their ids on the host (raise_bad_ids = false) pass no flag: nothing is recorded
// or read back, and the host does not wait for the kernels.
// Memory: table / out bf16 or f32; dout bf16 or f32 with dtable f32. Scratch from the caching
// allocator: 4 x T ints for the sort, 256 x T / kSortTile per pass for histograms,
// 2 x ceil(T / kCell) x C floats for the cell partials (T C / 8 bytes at most).
// Limits: T < 2^31, V < 2^31 - 1.
#include "cuda/embedding/embedding.cuh"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"

namespace engine::cuda {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kFwdMaxThreads = 256;
constexpr int kFwdUnroll = 4;    // packs per thread in flight (forward)
constexpr int kSortTile = 1024;  // tokens per block of a radix pass (one per thread)
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
constexpr int kScanThreads = 1024;
constexpr int kScanItems = 4;
constexpr int kFusedScanTiles = 64;   // sorts of up to 64 tiles scan inside the scatter
constexpr int kCell = 32;             // sorted entries per cell
constexpr int kCellThreads = 128;     // cell kernel: packs of columns per block (at most)
constexpr int kCellUnroll = 4;        // cell kernel: entries in flight per thread
constexpr int kCellMinBlocks = 4;     // cell kernel: resident blocks per SM (caps registers)
constexpr int kWarpsPerBlock = 4;     // fix-up kernel
constexpr int kRowUnroll = 8;         // fix-up kernel: partial rows in flight per warp
constexpr int kNoError = 0x7f7f7f7f;  // the flag's bytes after cudaMemset(0x7f): above any T

// ---------------------------------------------------------------------------------------------
// Forward.

template <typename T, int N, bool kAccumulate>
static __global__ void __launch_bounds__(kFwdMaxThreads)
    embedding_forward_kernel(const int32_t* ids, const T* table, T* out, int64_t n, int64_t begin,
                             int64_t rows, int64_t vocab, int64_t cols, int* err) {
  const int64_t packs = cols / N;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const int32_t id = ids[row];
    const bool bad = id < 0 || id >= vocab;
    if (bad && err && threadIdx.x == 0) atomicMin(err, static_cast<int>(row));
    const int64_t local = id - begin;
    T* dst = out + row * cols;
    // Another shard's id, or a bad one: a zero row, or untouched (+=).
    if (bad || local < 0 || local >= rows) {
      if constexpr (!kAccumulate) {
        Pack<T, N> zero;
#pragma unroll
        for (int j = 0; j < N; ++j) zero.v[j] = from_float<T>(0.f);
        for (int64_t q = threadIdx.x; q < packs; q += blockDim.x)
          reinterpret_cast<Pack<T, N>*>(dst)[q] = zero;
      }
      continue;
    }
    const T* src = table + local * cols;
    for (int64_t q0 = threadIdx.x; q0 < packs; q0 += kFwdUnroll * blockDim.x) {
      if constexpr (kAccumulate) {
        float v[kFwdUnroll][N], o[kFwdUnroll][N];
#pragma unroll
        for (int u = 0; u < kFwdUnroll; ++u) {
          const int64_t q = q0 + u * blockDim.x;
          if (q < packs) {
            load_pack<T, N>(src + q * N, v[u]);
            load_pack<T, N>(dst + q * N, o[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < kFwdUnroll; ++u) {
          const int64_t q = q0 + u * blockDim.x;
          if (q < packs) {
#pragma unroll
            for (int j = 0; j < N; ++j) o[u][j] += v[u][j];
            store_pack<T, N>(dst + q * N, o[u]);
          }
        }
      } else {
        Pack<T, N> v[kFwdUnroll];
#pragma unroll
        for (int u = 0; u < kFwdUnroll; ++u) {
          const int64_t q = q0 + u * blockDim.x;
          if (q < packs) v[u] = reinterpret_cast<const Pack<T, N>*>(src)[q];
        }
#pragma unroll
        for (int u = 0; u < kFwdUnroll; ++u) {
          const int64_t q = q0 + u * blockDim.x;
          if (q < packs) reinterpret_cast<Pack<T, N>*>(dst)[q] = v[u];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, steps 1 and 2: keys and the stable radix sort.

// The sort key of a token: its local id for ids of the shard, `rows` (sorted last, ignored) for
// other shards' ids and bad ones.
static __device__ __forceinline__ uint32_t sort_key(int32_t id, int64_t begin, int64_t rows,
                                                    int64_t vocab) {
  const int64_t local = static_cast<int64_t>(id) - begin;
  const bool mine = id >= 0 && id < vocab && local >= 0 && local < rows;
  return mine ? static_cast<uint32_t>(local) : static_cast<uint32_t>(rows);
}

// The first pass's histogram, keys straight from the ids: hist[0][d * tiles + tile] = number of
// the tile's keys with low digit d. Also zeroes this tile's column of the later passes'
// histograms (their scatters add into them) and records the first bad id.
static __global__ void __launch_bounds__(kSortTile)
    radix_first_hist_kernel(const int32_t* ids, int64_t n, int64_t begin, int64_t rows,
                            int64_t vocab, int64_t tiles, int passes, int* hist, int* err) {
  __shared__ int count[kDigits];
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) count[d] = 0;
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  if (i < n) {
    const int32_t id = ids[i];
    if ((id < 0 || id >= vocab) && err) atomicMin(err, static_cast<int>(i));
    atomicAdd(&count[sort_key(id, begin, rows, vocab) & (kDigits - 1)], 1);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) {
    hist[d * tiles + blockIdx.x] = count[d];
    for (int q = 1; q < passes; ++q) hist[(q * kDigits + d) * tiles + blockIdx.x] = 0;
  }
}

// In-place exclusive prefix sum of data[0, n) by one block, kScanThreads x kScanItems at a time
// (the histograms of sorts with more than kFusedScanTiles tiles).
static __global__ void __launch_bounds__(kScanThreads) exclusive_scan_kernel(int* data, int64_t n) {
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
    int incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += t;
    }
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      int w = warp_total[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(kFull, w, o);
        if (lane >= o) w += t;
      }
      warp_total[lane] = w;  // inclusive over warps
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
  const int* hist;  // this pass's counts [digit][tile], or their exclusive scan (!kFusedScan)
  int* next_hist;   // the next pass's counts, added here (nullptr: the last pass)
  int64_t n, tiles, begin, rows, vocab;
  int shift;
};

// Stable scatter of one tile by the digit at `shift`. The tile's offset of digit d is the
// exclusive scan of hist at [d][tile]: read from the scanned histogram, or (kFusedScan, up to
// kFusedScanTiles tiles) summed here (threads d < 256: the digit's tiles before this one, and
// its total, then a scan of the totals over the digits). The next pass's histogram counts each
// key at the tile of its output position (integer atomics: the same counts in any order).
template <bool kFusedScan>
static __global__ void __launch_bounds__(kSortTile) radix_scatter_kernel(const SortPass p) {
  constexpr int kWarps = kSortTile / 32;
  __shared__ int warp_count[kWarps][kDigits];  // count, then exclusive prefix over the warps
  __shared__ int base[kDigits];
  __shared__ int digit_warp_total[kDigits / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k = threadIdx.x; k < kWarps * kDigits; k += kSortTile) (&warp_count[0][0])[k] = 0;
  int before = 0, total = 0;
  if (threadIdx.x < kDigits) {
    const int d = threadIdx.x;
    if constexpr (kFusedScan) {
      for (int64_t t = 0; t < p.tiles; ++t) {
        const int c = p.hist[d * p.tiles + t];
        total += c;
        if (t < blockIdx.x) before += c;
      }
      // Exclusive scan of the digit totals: within each warp of digits, then over the warps.
      int incl = total;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
      }
      if (lane == 31) digit_warp_total[warp] = incl;
      total = incl - total;  // exclusive within the warp
    } else {
      base[d] = p.hist[d * p.tiles + blockIdx.x];
    }
  }
  __syncthreads();
  if constexpr (kFusedScan) {
    if (threadIdx.x < kDigits) {
      int carry = 0;
      for (int w = 0; w < warp; ++w) carry += digit_warp_total[w];
      base[threadIdx.x] = carry + total + before;
    }
  }
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  const bool valid = i < p.n;
  uint32_t key = 0u;
  int32_t val = 0;
  if (valid) {
    if (p.keys_in) {
      key = p.keys_in[i];
      val = p.vals_in[i];
    } else {
      key = sort_key(p.ids[i], p.begin, p.rows, p.vocab);
      val = static_cast<int32_t>(i);
    }
  }
  const int digit = valid ? static_cast<int>((key >> p.shift) & (kDigits - 1)) : kDigits;
  const unsigned peers = __match_any_sync(kFull, digit);  // lanes of this warp with this digit
  const unsigned lower = peers & ((1u << lane) - 1u);
  if (valid && lower == 0) warp_count[warp][digit] = __popc(peers);
  __syncthreads();
  if (threadIdx.x < kDigits) {
    int run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int c = warp_count[w][threadIdx.x];
      warp_count[w][threadIdx.x] = run;
      run += c;
    }
  }
  __syncthreads();
  if (valid) {
    const int pos = base[digit] + warp_count[warp][digit] + __popc(lower);
    p.keys_out[pos] = key;
    p.vals_out[pos] = val;
    if (p.next_hist) {
      const int next = static_cast<int>((key >> (p.shift + kDigitBits)) & (kDigits - 1));
      atomicAdd(&p.next_hist[next * p.tiles + pos / kSortTile], 1);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 3: cells and the fix-up of runs spanning cells.

template <typename T>
struct EmbBwdParams {
  const T* dout;          // (n, cols)
  float* dtable;          // (vocab, cols): here vocab = the shard's rows
  const uint32_t* keys;   // (n) local ids in sorted order (vocab for ignored ones, last)
  const int32_t* tokens;  // (n) token positions in sorted order
  float* slot_own;        // (cells, cols): first piece of a run that continues past its cell
  float* slot_in;         // (cells, cols): the piece at the start of a cell, of an earlier run
  int64_t n, cols, vocab, cells, chunks;
};

// Where the sum of a piece goes (the piece ending at a cell entry).
enum : int8_t { kNotEnd = 0, kToTable = 1, kToOwn = 2, kToIn = 3 };

// Block blockIdx.x = cell * chunks + chunk: the cell's kCell sorted entries over the chunk's
// columns (blockDim.x packs of N, one per thread; the chunks of a cell are neighbours in the
// launch order, so a row's columns are read and written together). The cell's keys and tokens
// and, per entry, where the piece ending there goes are set up in shared memory; then every
// thread walks the entries in order, kCellUnroll at a time: their dout packs and the dtable packs
// of the whole runs ending among them are loaded together, then added in order, and each piece's
// sum goes out where it ends (dtable(key) = dtable(key) + sum for a whole run, slot_own / slot_in
// for the pieces of runs spanning cells). Every branch is uniform over the block.
template <typename T, int N>
static __global__ void __launch_bounds__(kCellThreads, kCellMinBlocks)
    embedding_cell_kernel(const EmbBwdParams<T> p) {
  __shared__ uint32_t s_key[kCell];
  __shared__ int32_t s_tok[kCell];
  __shared__ int8_t s_end[kCell];
  __shared__ int s_len;
  const int64_t cell = blockIdx.x / p.chunks, chunk = blockIdx.x % p.chunks;
  const int64_t start = cell * kCell;
  const int avail = static_cast<int>(std::min<int64_t>(kCell, p.n - start));
  if (threadIdx.x == 0) s_len = 0;
  for (int r = threadIdx.x; r < kCell; r += blockDim.x) {
    s_key[r] = r < avail ? p.keys[start + r] : 0xffffffffu;
    s_tok[r] = r < avail ? p.tokens[start + r] : 0;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < kCell; r += blockDim.x) {
    const uint32_t key = s_key[r];
    const bool valid = key < p.vocab;  // the ignored keys (and the padding) sort last
    int8_t end = kNotEnd;
    if (valid && (r + 1 == avail || s_key[r + 1] != key)) {
      // The piece holding entry 0 may belong to a run begun in an earlier cell; the one ending at
      // the cell's last entry may go on in the next cell.
      const bool starts_run = key != s_key[0] || start == 0 || p.keys[start - 1] != key;
      const bool goes_on = r == kCell - 1 && start + kCell < p.n && p.keys[start + kCell] == key;
      end = starts_run ? (goes_on ? kToOwn : kToTable) : kToIn;
    }
    s_end[r] = end;
    if (valid && (r + 1 == avail || !(s_key[r + 1] < p.vocab))) s_len = r + 1;
  }
  __syncthreads();
  const int len = s_len;
  const int64_t col = (chunk * blockDim.x + threadIdx.x) * N;
  if (col >= p.cols) return;
  float sum[N];
#pragma unroll
  for (int j = 0; j < N; ++j) sum[j] = 0.f;
  for (int r0 = 0; r0 < len; r0 += kCellUnroll) {
    Pack<T, N> v[kCellUnroll];
    float d[kCellUnroll][N];
#pragma unroll
    for (int u = 0; u < kCellUnroll; ++u) {
      const int r = r0 + u;
      if (r < len) {
        const T* row = p.dout + static_cast<int64_t>(s_tok[r]) * p.cols;
        v[u] = *reinterpret_cast<const Pack<T, N>*>(row + col);
        if (s_end[r] == kToTable)
          load_pack<float, N>(p.dtable + static_cast<int64_t>(s_key[r]) * p.cols + col, d[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kCellUnroll; ++u) {
      const int r = r0 + u;
      if (r < len) {
#pragma unroll
        for (int j = 0; j < N; ++j) sum[j] += to_float(v[u].v[j]);
        const int8_t end = s_end[r];
        if (end != kNotEnd) {
          if (end == kToTable) {
#pragma unroll
            for (int j = 0; j < N; ++j) d[u][j] += sum[j];
            store_pack<float, N>(p.dtable + static_cast<int64_t>(s_key[r]) * p.cols + col, d[u]);
          } else {
            float* slot = end == kToOwn ? p.slot_own : p.slot_in;
            store_pack<float, N>(slot + cell * p.cols + col, sum);
          }
#pragma unroll
          for (int j = 0; j < N; ++j) sum[j] = 0.f;
        }
      }
    }
  }
}

// blockIdx.x * kWarpsPerBlock + warp: a cell; its warp acts if the cell's last run starts in it
// and continues past it (the cell owns that run): dtable(key) += slot_own(cell) + slot_in(cell+1)
// + ... + slot_in(last cell of the run), in that order.
template <int N>
static __global__ void __launch_bounds__(32 * kWarpsPerBlock)
    embedding_fixup_kernel(const uint32_t* keys, const float* slot_own, const float* slot_in,
                           float* dtable, int64_t n, int64_t cols, int64_t vocab, int64_t cells) {
  const int lane = threadIdx.x & 31;
  const int64_t cell = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (cell >= cells) return;
  const int64_t start = cell * kCell, end = std::min(n, start + kCell);
  if (end >= n) return;
  const uint32_t key = keys[end - 1];
  if (key >= vocab || keys[end] != key) return;     // the last run ends in this cell
  if (start > 0 && keys[start - 1] == key) return;  // it began in an earlier cell: not the owner
  // The last cell of the run: the first cell c > cell whose end is n or followed by another key.
  int64_t last = -1;
  for (int64_t c0 = cell + 1; last < 0; c0 += 32) {
    const int64_t c = c0 + lane;
    bool stop = true;
    if (c < cells) {
      const int64_t e = std::min(n, (c + 1) * kCell);
      stop = e >= n || keys[e] != key;
    }
    const unsigned b = __ballot_sync(kFull, stop);
    if (b) last = c0 + __ffs(b) - 1;
  }
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * 32 + lane) * N;
  if (col >= cols) return;
  float* dst = dtable + static_cast<int64_t>(key) * cols + col;
  float acc[N], base[N];
  load_pack<float, N>(dst, base);
  load_pack<float, N>(slot_own + cell * cols + col, acc);
  for (int64_t c0 = cell + 1; c0 <= last; c0 += kRowUnroll) {
    float v[kRowUnroll][N];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u)
      if (c0 + u <= last) load_pack<float, N>(slot_in + (c0 + u) * cols + col, v[u]);
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u)
      if (c0 + u <= last) {
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] += v[u][j];
      }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) base[j] += acc[j];
  store_pack<float, N>(dst, base);
}

// ---------------------------------------------------------------------------------------------
// Host side.

// ids (T) i32 on cuda; returns T.
static int64_t check_ids(const Tensor& ids, const char* op) {
  expect_cuda(ids, op, "ids");
  ENSURE(ids.dtype == DType::I32, op, ": ids is ", dtype_name(ids.dtype), ", expected i32");
  ENSURE(ids.ndim() == 1, op, ": ids must be 1-D, got shape ", ids.shape.str());
  ENSURE(ids.size(0) < kNoError, op, ": T = ", ids.size(0), " tokens is too many");
  return ids.size(0);
}

// The vocabulary size of a table of `rows` rows holding ids [begin, begin + rows); checks that
// the shard lies inside it (total = 0: unsharded, begin must be 0).
static int64_t vocab_of(int64_t rows, int64_t begin, int64_t total, const char* op,
                        const char* name) {
  if (total == 0) {
    ENSURE(begin == 0, op, ": vocab_begin = ", begin,
           " but vocab_total = 0 (unsharded: the table is the whole vocabulary)");
    total = rows;
  }
  ENSURE(total >= 0 && begin >= 0 && begin + rows <= total, op, ": ", name, " rows hold ids [",
         begin, ", ", begin + rows, "), not a shard of a vocabulary of ", total, " ids");
  ENSURE(total < kNoError, op, ": V = ", total, " is too large");
  return total;
}

// A device int set to kNoError, for the first bad token position.
static Buffer error_flag() {
  Buffer flag(sizeof(int), Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(flag.data(), 0x7f, sizeof(int), stream()));
  return flag;
}

// Reads the flag back (waits for the kernels) and raises if a token had a bad id.
static void raise_if_bad_id(const Buffer& flag, const Tensor& ids, int64_t vocab, const char* op) {
  int first = kNoError;
  copy_bytes(&first, false, flag.data(), true, sizeof(int));
  if (first >= ids.size(0)) return;
  int32_t id = 0;
  copy_bytes(&id, false, static_cast<const int32_t*>(ids.data) + first, true, sizeof(int32_t));
  RAISE(op, ": ids[", first, "] = ", id, " out of range [0, ", vocab, ") (token position ", first,
        ")");
}

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin, int64_t vocab_total, bool raise_bad_ids) {
  const char* op = "embedding_forward";
  const int64_t n = check_ids(ids, op);
  expect_cuda_float(table, op, "table");
  ENSURE(table.ndim() == 2, op, ": table must be 2-D (V, C), got shape ", table.shape.str());
  const int64_t rows = table.size(0), cols = table.size(1);
  const int64_t vocab = vocab_of(rows, vocab_begin, vocab_total, op, "table");
  expect_cuda(out, table.dtype, {n, cols}, op, "out");
  if (n == 0) return;
  Buffer flag = raise_bad_ids ? error_flag() : Buffer{};
  int* err = static_cast<int*>(flag.data());
  float_switch(table.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const bool vec = cols % V == 0 && aligned16(table.data) && aligned16(out.data);
    const int elems = vec ? V : 1;
    const int64_t packs = cols / elems;
    const int threads = static_cast<int>(
        std::clamp<int64_t>(ceil_div(ceil_div(packs, kFwdUnroll), 32) * 32, 32, kFwdMaxThreads));
    const int32_t* pid = static_cast<const int32_t*>(ids.data);
    const T* tab = static_cast<const T*>(table.data);
    T* po = static_cast<T*>(out.data);
    auto go = [&](auto kernel) {
      const int grid = persistent_grid(kernel, threads, 0, n);
      kernel<<<grid, threads, 0, stream()>>>(pid, tab, po, n, vocab_begin, rows, vocab, cols, err);
      check_launch("embedding_forward_kernel");
    };
    if (vec) {
      if (accumulate)
        go(embedding_forward_kernel<T, V, true>);
      else
        go(embedding_forward_kernel<T, V, false>);
    } else {
      if (accumulate)
        go(embedding_forward_kernel<T, 1, true>);
      else
        go(embedding_forward_kernel<T, 1, false>);
    }
  });
  if (raise_bad_ids) raise_if_bad_id(flag, ids, vocab, op);
}

void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_begin, int64_t vocab_total, bool raise_bad_ids) {
  const char* op = "embedding_backward";
  const int64_t n = check_ids(ids, op);
  expect_cuda(dtable, op, "dtable");
  ENSURE(dtable.ndim() == 2, op, ": dtable must be 2-D (V, C), got shape ", dtable.shape.str());
  ENSURE(dtable.dtype == DType::F32, op, ": dtable is ", dtype_name(dtable.dtype),
         ", the kernel accumulates into f32");
  const int64_t rows = dtable.size(0), cols = dtable.size(1);
  const int64_t vocab = vocab_of(rows, vocab_begin, vocab_total, op, "dtable");
  expect_cuda_float(dout, op, "dout");
  ENSURE(dout.shape == Shape({n, cols}), op, ": dout has shape ", dout.shape.str(), ", expected ",
         Shape({n, cols}).str());
  if (n == 0) return;

  Buffer flag = raise_bad_ids ? error_flag() : Buffer{};
  int* err = static_cast<int*>(flag.data());
  // Keys and values, double-buffered for the sort passes; a histogram per pass.
  Buffer sort_buf(4 * static_cast<size_t>(n) * sizeof(int32_t), Device::CUDA);
  uint32_t* keys[2] = {static_cast<uint32_t*>(sort_buf.data()),
                       static_cast<uint32_t*>(sort_buf.data()) + n};
  int32_t* vals[2] = {static_cast<int32_t*>(sort_buf.data()) + 2 * n,
                      static_cast<int32_t*>(sort_buf.data()) + 3 * n};
  const int32_t* pid = static_cast<const int32_t*>(ids.data);
  const int bits = std::bit_width(static_cast<uint64_t>(rows));  // keys are <= rows
  const int passes = std::max(1, static_cast<int>(ceil_div(bits, kDigitBits)));
  const int64_t tiles = ceil_div(n, kSortTile);
  Buffer hist_buf(static_cast<size_t>(passes) * kDigits * tiles * sizeof(int), Device::CUDA);
  int* hist = static_cast<int*>(hist_buf.data());
  radix_first_hist_kernel<<<static_cast<unsigned>(tiles), kSortTile, 0, stream()>>>(
      pid, n, vocab_begin, rows, vocab, tiles, passes, hist, err);
  check_launch("radix_first_hist_kernel");
  const bool fused_scan = tiles <= kFusedScanTiles;
  for (int q = 0; q < passes; ++q) {
    int* h = hist + static_cast<int64_t>(q) * kDigits * tiles;
    if (!fused_scan) {
      exclusive_scan_kernel<<<1, kScanThreads, 0, stream()>>>(h, kDigits * tiles);
      check_launch("exclusive_scan_kernel");
    }
    SortPass sp{};
    sp.keys_in = q == 0 ? nullptr : keys[(q - 1) & 1];
    sp.vals_in = q == 0 ? nullptr : vals[(q - 1) & 1];
    sp.ids = pid;
    sp.keys_out = keys[q & 1];
    sp.vals_out = vals[q & 1];
    sp.hist = h;
    sp.next_hist = q + 1 < passes ? h + kDigits * tiles : nullptr;
    sp.n = n;
    sp.tiles = tiles;
    sp.begin = vocab_begin;
    sp.rows = rows;
    sp.vocab = vocab;
    sp.shift = q * kDigitBits;
    if (fused_scan)
      radix_scatter_kernel<true><<<static_cast<unsigned>(tiles), kSortTile, 0, stream()>>>(sp);
    else
      radix_scatter_kernel<false><<<static_cast<unsigned>(tiles), kSortTile, 0, stream()>>>(sp);
    check_launch("radix_scatter_kernel");
  }
  const int last = (passes - 1) & 1;

  if (cols > 0) {
    const int64_t cells = ceil_div(n, kCell);
    Buffer slots(2 * static_cast<size_t>(cells) * cols * sizeof(float), Device::CUDA);
    float_switch(dout.dtype, [&](auto tag) {
      using T = decltype(tag);
      constexpr int V = 16 / sizeof(T);
      EmbBwdParams<T> p{};
      p.dout = static_cast<const T*>(dout.data);
      p.dtable = static_cast<float*>(dtable.data);
      p.keys = keys[last];
      p.tokens = vals[last];
      p.slot_own = static_cast<float*>(slots.data());
      p.slot_in = p.slot_own + cells * cols;
      p.n = n;
      p.cols = cols;
      p.vocab = rows;
      p.cells = cells;
      auto go = [&](auto cell_kernel, auto fixup_kernel, int elems) {
        const int64_t packs = ceil_div(cols, elems);
        const int threads =
            static_cast<int>(std::min<int64_t>(kCellThreads, ceil_div(packs, 32) * 32));
        p.chunks = ceil_div(packs, threads);
        ENSURE(cells * p.chunks < (int64_t{1} << 31), op, ": T = ", n, " x C = ", cols,
               " is too large");
        cell_kernel<<<static_cast<unsigned>(cells * p.chunks), threads, 0, stream()>>>(p);
        check_launch("embedding_cell_kernel");
        const int64_t chunks = ceil_div(cols, 32 * elems);
        ENSURE(chunks < 65536, op, ": C = ", cols, " is too wide");
        const dim3 fixup_grid(static_cast<unsigned>(ceil_div(cells, kWarpsPerBlock)),
                              static_cast<unsigned>(chunks));
        fixup_kernel<<<fixup_grid, 32 * kWarpsPerBlock, 0, stream()>>>(
            p.keys, p.slot_own, p.slot_in, p.dtable, n, cols, rows, cells);
        check_launch("embedding_fixup_kernel");
      };
      if (cols % V == 0 && aligned16(dout.data) && aligned16(dtable.data))
        go(embedding_cell_kernel<T, V>, embedding_fixup_kernel<V>, V);
      else
        go(embedding_cell_kernel<T, 1>, embedding_fixup_kernel<1>, 1);
    });
  }
  if (raise_bad_ids) raise_if_bad_id(flag, ids, vocab, op);
}

}  // namespace engine::cuda
