// Embedding lookups over a table of R rows holding ids [B, B + R) of a vocabulary of V ids
// (unsharded: B = 0, R = V); ids (T) i32 in [0, V), local id l(t) = ids(t) - B:
//   forward:  out(t) = table(l(t)) for l(t) in [0, R), else a zero row    (accumulate:
//             out(t) += table(l(t)), f32 add, one rounding; rows of other shards untouched)
//   backward: dtable(l) += sum_{t : l(t) = l} dout(t), f32, the rows of one id in token order;
//             tokens of other shards add nothing
// Forward: persistent grid, a row per block at a time, up to 4 16-byte packs per thread in flight.
// Backward, deterministic without float atomics:
//   1. keys: key(t) = l(t) (R for an invalid id or another shard's, which sorts last and is
//      then ignored), value t.
//   2. Stable LSD radix sort of (key, t) by key, 8 bits a pass over bit_width(R) bits. A pass:
//      per tile of kSortTile tokens a digit histogram, one exclusive scan over (digit, tile), a
//      stable scatter (rank within a warp from __match_any_sync, across the warps of the tile
//      from a per-warp digit table). Afterwards each id's tokens are contiguous, in token order.
//   3. Pieces: the sorted list is cut at every change of key and at every multiple of kCell. One
//      warp per (piece, chunk of 32 packs of columns) sums the piece's dout rows in sorted order.
//      A piece that holds a whole run (all tokens of its id) adds its sum into dtable itself; a run
//      spanning several cells leaves one partial sum per cell in scratch (slot_own: the cell where
//      the run starts; slot_in: each later cell), and a fix-up kernel, one warp per owning cell
//      and chunk, adds them in cell order into dtable.
//   Every sum has a fixed order, so dtable gets the same bits on every run with the same ids.
// Invalid ids: each kernel that reads ids records the first bad position with an integer
// atomicMin into a device flag; the launcher reads the flag back after its kernels and raises
// naming the position and the id (as the CPU reference does). Forward gives bad ids a zero row
// (= ; += leaves the row untouched); backward adds nothing for them. Callers that checked their ids on the host
// (raise_bad_ids = false) pass no flag: nothing is recorded or read back, and the host does not
// wait for the kernels.
// Memory: table / out bf16 or f32; dout bf16 or f32 with dtable f32. Scratch from the caching
// allocator: 4 x T ints for the sort, 256 x T / kSortTile for histograms, 2 x ceil(T / kCell) x C
// floats for the cell partials (T C / 8 bytes at most). Limits: T < 2^31, V < 2^31 - 1.
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
constexpr int kCell = 64;             // sorted entries per cell: two per lane of a warp
constexpr int kWarpsPerBlock = 4;     // piece / fix-up kernels
constexpr int kRowUnroll = 8;         // dout rows in flight per warp
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
// Backward, step 1 and 2: keys and the stable radix sort.

// key(t) = ids(t) - begin for ids of the shard, `rows` (sorted last, ignored) for the others.
static __global__ void embedding_keys_kernel(const int32_t* ids, int64_t n, int64_t begin,
                                             int64_t rows, int64_t vocab, uint32_t* keys,
                                             int32_t* vals, int* err) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t id = ids[i];
  const bool ok = id >= 0 && id < vocab;
  const int64_t local = id - begin;
  const bool mine = ok && local >= 0 && local < rows;
  keys[i] = mine ? static_cast<uint32_t>(local) : static_cast<uint32_t>(rows);
  vals[i] = static_cast<int32_t>(i);
  if (!ok && err) atomicMin(err, static_cast<int>(i));
}

// hist[d * tiles + tile] = number of keys of the tile with digit d.
static __global__ void __launch_bounds__(kSortTile)
    radix_hist_kernel(const uint32_t* keys, int64_t n, int shift, int64_t tiles, int* hist) {
  __shared__ int count[kDigits];
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) count[d] = 0;
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  if (i < n) atomicAdd(&count[(keys[i] >> shift) & (kDigits - 1)], 1);
  __syncthreads();
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) hist[d * tiles + blockIdx.x] = count[d];
}

// In-place exclusive prefix sum of data[0, n) by one block, kScanThreads x kScanItems at a time.
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

// Stable scatter of one tile by the digit at `shift`; offsets = the scanned histogram.
static __global__ void __launch_bounds__(kSortTile)
    radix_scatter_kernel(const uint32_t* keys_in, const int32_t* vals_in, uint32_t* keys_out,
                         int32_t* vals_out, int64_t n, int shift, int64_t tiles,
                         const int* offsets) {
  constexpr int kWarps = kSortTile / 32;
  __shared__ int warp_count[kWarps][kDigits];  // count, then exclusive prefix over the warps
  __shared__ int base[kDigits];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k = threadIdx.x; k < kWarps * kDigits; k += kSortTile) (&warp_count[0][0])[k] = 0;
  for (int d = threadIdx.x; d < kDigits; d += kSortTile) base[d] = offsets[d * tiles + blockIdx.x];
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSortTile + threadIdx.x;
  const bool valid = i < n;
  const uint32_t key = valid ? keys_in[i] : 0u;
  const int32_t val = valid ? vals_in[i] : 0;
  const int digit = valid ? static_cast<int>((key >> shift) & (kDigits - 1)) : kDigits;
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
    keys_out[pos] = key;
    vals_out[pos] = val;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 3: pieces and the fix-up of runs spanning cells.

template <typename T>
struct EmbBwdParams {
  const T* dout;          // (n, cols)
  float* dtable;          // (vocab, cols): here vocab = the shard's rows
  const uint32_t* keys;   // (n) local ids in sorted order (vocab for ignored ones, last)
  const int32_t* tokens;  // (n) token positions in sorted order
  float* slot_own;        // (cells, cols): first piece of a run that continues past its cell
  float* slot_in;         // (cells, cols): the piece at the start of a cell, of an earlier run
  int64_t n, cols, vocab, cells;
};

// blockIdx.x * kWarpsPerBlock + warp: a sorted index, processed if it starts a piece;
// blockIdx.y: the column chunk (32 packs of N).
template <typename T, int N>
static __global__ void __launch_bounds__(32 * kWarpsPerBlock)
    embedding_piece_kernel(const EmbBwdParams<T> p) {
  const int lane = threadIdx.x & 31;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (i >= p.n) return;
  const uint32_t key = p.keys[i];
  const bool run_start = i == 0 || p.keys[i - 1] != key;
  if ((!run_start && i % kCell != 0) || key >= p.vocab) return;
  const int64_t cell = i / kCell;
  const int64_t cell_end = std::min(p.n, (cell + 1) * kCell);
  // The piece: entries [i, end) with this key inside the cell (keys are sorted, so contiguous).
  const int64_t j0 = i + lane, j1 = i + 32 + lane;
  const bool in0 = j0 < cell_end && p.keys[j0] == key;
  const bool in1 = j1 < cell_end && p.keys[j1] == key;
  const int len = __popc(__ballot_sync(kFull, in0)) + __popc(__ballot_sync(kFull, in1));
  const int64_t end = i + len;
  const bool run_continues = end == cell_end && end < p.n && p.keys[end] == key;
  const int32_t tok0 = in0 ? p.tokens[j0] : 0, tok1 = in1 ? p.tokens[j1] : 0;

  const int64_t col = (static_cast<int64_t>(blockIdx.y) * 32 + lane) * N;
  const bool active = col < p.cols;
  const bool whole_run = run_start && !run_continues;
  float* target = whole_run ? p.dtable + static_cast<int64_t>(key) * p.cols
                            : (run_start ? p.slot_own : p.slot_in) + cell * p.cols;
  float acc[N];
  if (whole_run && active) {
    load_pack<float, N>(target + col, acc);  // issued first: its latency overlaps the row loads
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = 0.f;
  }
  float sum[N];
#pragma unroll
  for (int j = 0; j < N; ++j) sum[j] = 0.f;
  for (int r0 = 0; r0 < len; r0 += kRowUnroll) {
    float v[kRowUnroll][N];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int r = r0 + u;
      if (r < len) {  // uniform over the warp
        const int32_t tok = __shfl_sync(kFull, r < 32 ? tok0 : tok1, r & 31);
        if (active) load_pack<T, N>(p.dout + static_cast<int64_t>(tok) * p.cols + col, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u)
      if (r0 + u < len && active) {
#pragma unroll
        for (int j = 0; j < N; ++j) sum[j] += v[u][j];
      }
  }
  if (!active) return;
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] += sum[j];
  store_pack<float, N>(target + col, acc);
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
  // Keys and values, double-buffered for the sort passes.
  Buffer sort_buf(4 * static_cast<size_t>(n) * sizeof(int32_t), Device::CUDA);
  uint32_t* keys[2] = {static_cast<uint32_t*>(sort_buf.data()),
                       static_cast<uint32_t*>(sort_buf.data()) + n};
  int32_t* vals[2] = {static_cast<int32_t*>(sort_buf.data()) + 2 * n,
                      static_cast<int32_t*>(sort_buf.data()) + 3 * n};
  const int32_t* pid = static_cast<const int32_t*>(ids.data);
  embedding_keys_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, stream()>>>(
      pid, n, vocab_begin, rows, vocab, keys[0], vals[0], err);
  check_launch("embedding_keys_kernel");

  const int bits = std::bit_width(static_cast<uint64_t>(rows));  // keys are <= rows
  const int64_t tiles = ceil_div(n, kSortTile);
  Buffer hist_buf(static_cast<size_t>(kDigits) * tiles * sizeof(int), Device::CUDA);
  int* hist = static_cast<int*>(hist_buf.data());
  int cur = 0;
  for (int shift = 0; shift < bits; shift += kDigitBits, cur ^= 1) {
    radix_hist_kernel<<<static_cast<unsigned>(tiles), kSortTile, 0, stream()>>>(keys[cur], n, shift,
                                                                                tiles, hist);
    check_launch("radix_hist_kernel");
    exclusive_scan_kernel<<<1, kScanThreads, 0, stream()>>>(hist, kDigits * tiles);
    check_launch("exclusive_scan_kernel");
    radix_scatter_kernel<<<static_cast<unsigned>(tiles), kSortTile, 0, stream()>>>(
        keys[cur], vals[cur], keys[cur ^ 1], vals[cur ^ 1], n, shift, tiles, hist);
    check_launch("radix_scatter_kernel");
  }

  if (cols > 0) {
    const int64_t cells = ceil_div(n, kCell);
    Buffer slots(2 * static_cast<size_t>(cells) * cols * sizeof(float), Device::CUDA);
    float_switch(dout.dtype, [&](auto tag) {
      using T = decltype(tag);
      constexpr int V = 16 / sizeof(T);
      EmbBwdParams<T> p{};
      p.dout = static_cast<const T*>(dout.data);
      p.dtable = static_cast<float*>(dtable.data);
      p.keys = keys[cur];
      p.tokens = vals[cur];
      p.slot_own = static_cast<float*>(slots.data());
      p.slot_in = p.slot_own + cells * cols;
      p.n = n;
      p.cols = cols;
      p.vocab = rows;
      p.cells = cells;
      auto go = [&](auto piece_kernel, auto fixup_kernel, int elems) {
        const int64_t chunks = ceil_div(cols, 32 * elems);
        ENSURE(chunks < 65536, op, ": C = ", cols, " is too wide");
        const dim3 piece_grid(static_cast<unsigned>(ceil_div(n, kWarpsPerBlock)),
                              static_cast<unsigned>(chunks));
        piece_kernel<<<piece_grid, 32 * kWarpsPerBlock, 0, stream()>>>(p);
        check_launch("embedding_piece_kernel");
        const dim3 fixup_grid(static_cast<unsigned>(ceil_div(cells, kWarpsPerBlock)),
                              static_cast<unsigned>(chunks));
        fixup_kernel<<<fixup_grid, 32 * kWarpsPerBlock, 0, stream()>>>(
            p.keys, p.slot_own, p.slot_in, p.dtable, n, cols, rows, cells);
        check_launch("embedding_fixup_kernel");
      };
      if (cols % V == 0 && aligned16(dout.data) && aligned16(dtable.data))
        go(embedding_piece_kernel<T, V>, embedding_fixup_kernel<V>, V);
      else
        go(embedding_piece_kernel<T, 1>, embedding_fixup_kernel<1>, 1);
    });
  }
  if (raise_bad_ids) raise_if_bad_id(flag, ids, vocab, op);
}

}  // namespace engine::cuda
