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
//   2. (Steps 1 and 2 live in radix_sort.cuh.) Stable LSD radix sort of (key, t) by key, 8
//      bits a pass over bit_width(R) bits: a histogram kernel for the first pass (per tile of
//      kSortTile tokens), then a scatter kernel a pass, which counts its outputs into the next
//      pass's histogram (integer atomics). Short
//      sorts (up to kShortSortTiles tiles: T <= 32768) keep the counts tile-major and scan them
//      inside each scatter, every block reading all tiles' counts at once (whole sectors);
//      longer ones keep them digit-major, with a scan kernel before each scatter. Lanes rank
//      within a warp by __match_any_sync, warps by a per-warp digit table; the tile's keys are
//      then staged in shared memory in digit order and written out by consecutive threads, so a
//      digit's keys leave as one contiguous piece. Afterwards each id's tokens are contiguous,
//      in token order.
//   3. Cells: the sorted list is cut into cells of kCell entries, a block per (cell, chunk of
//      columns). A cell sums every run (the tokens of one id) that starts in it, whole, in token
//      order, with kCellUnroll dout rows in flight per thread, and adds the sum into dtable, also
//      when the run goes on past the cell. Only runs of more than kLongRun entries are cut at
//      the cells' edges: each piece is summed into its cell's slot, and the cell whose arrival
//      completes the run (a counter per run and chunk, after a fence; the counters live in a
//      zeroed buffer that only grows, and the completing block resets its own) adds the pieces
//      in cell order into dtable. The block reads the keys within kLongRun of its cell to tell
//      the two apart.
//   Every sum has a fixed order, so dtable gets the same bits on every run with the same ids.
//   Kernels (T <= 32768, V <= 65535): histogram, two scatters, cells; the last three are
//   launched as programmatic dependents of the kernel ahead (their blocks resident while it
//   finishes, each waiting in griddepcontrol.wait; the first scatter reads its ids before).
//   Why this shape (profiles and figures: docs/PERF.md): the scatters once read all tiles'
//   counts one 4-byte word per 64 bytes (digit-major), zeroed the long runs' counters for every
//   key and wrote one scattered word per key, most of their L2 sectors excess; tile-major
//   counts, self-resetting counters, staged output, cells of 64 entries by 256 threads with 6
//   rows in flight and the dependent launches each made the op faster. The cells kernel takes
//   most of the time and is latency-bound (warps waiting on loads). Tried and slower: each
//   thread's dout and dtable packs copied by cp.async into a 3- or 4-stage shared-memory ring
//   (shared memory cut the resident blocks); a warp's f32 columns as two 512-byte halves
//   instead of 32 contiguous bytes a thread; sort tiles of 512 keys (slower scatters); 16-entry
//   cells; 8 rows in flight (spills); earlier a one-kernel sort in a cluster of 8 blocks.
// Invalid ids: the forward kernel and the sort's first scatter record the first bad position
// with an integer atomicMin into a device flag; the launcher reads the flag back after its
// kernels and raises naming the position and the id (as the CPU reference does). Forward gives
// bad ids a zero row (= ; += leaves the row untouched); backward adds nothing for them. Callers
// that checked their ids on the host (raise_bad_ids = false) pass no flag: nothing is recorded
// or read back, and the host does not wait for the kernels.
// Memory: table / out bf16 or f32; dout bf16 or f32 with dtable f32. Scratch from the caching
// allocator: 4 x T ints for the sort, 256 x T / kSortTile per pass for the histograms,
// 2 x ceil(T / kCell) x C floats for the long runs' pieces (T C / 4 bytes), R x 2 x chunks ints
// for their cells; R x chunks counters in a device buffer that only grows.
// Limits: T < 2^31, V < 2^31 - 1.
// The shared preconditions ran before (ops/embedding.cpp); the launchers check what is theirs:
// the table (forward) and dout (backward) in bf16 or f32, dtable in f32, T and V below the
// flag's sentinel, the cells' grid within 2^31 blocks.
#include "ops/embedding.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <utility>

#include "core/buffer.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector.cuh"
#include "cuda/embedding/radix_sort.cuh"

namespace engine::cuda {

constexpr int kFwdMaxThreads = 256;
constexpr int kFwdUnroll = 4;    // packs per thread in flight (forward)
constexpr int kCell = 64;            // sorted entries per cell
constexpr int kLongRun = 64;         // runs of more entries are summed in pieces, one per cell
constexpr int kWin = kCell + 2 * kLongRun;  // keys a cell looks at
constexpr int kWinWords = kWin / 32;
constexpr int kCellThreads = 256;    // cell kernel: packs of columns per block (at most)
constexpr int kCellUnroll = 6;       // cell kernel: entries in flight per thread
constexpr int kCellMinBlocks = 2;    // cell kernel: resident blocks per SM (caps registers)
static_assert(kWin % 32 == 0 && (kCell + kLongRun) % 32 == 0, "a cell's windows are whole warps");
constexpr int kNoError = 0x7f7f7f7f;  // the flag's bytes after cudaMemset(0x7f): above any T

// ---------------------------------------------------------------------------------------------
// Forward.

template <typename T, int N, bool kAccumulate>
static __global__ void __launch_bounds__(kFwdMaxThreads)
    embedding_forward_kernel(const int32_t* ids, const T* table, T* out, int64_t n, int64_t begin,
                             int64_t rows, int64_t vocab, int64_t cols, int* err) {
  wait_for_previous_kernel();
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
// Backward, step 3: cells.

template <typename T>
struct EmbBwdParams {
  const T* dout;          // (n, cols)
  float* dtable;          // (vocab, cols): here vocab = the shard's rows
  const uint32_t* keys;   // (n) local ids in sorted order (vocab for ignored ones, last)
  const int32_t* tokens;  // (n) token positions in sorted order
  float* slot_own;        // (cells, cols): a cell's piece of the long run that starts in it
  float* slot_in;         // (cells, cols): its piece of a long run begun in an earlier cell
  int* run_count;         // (vocab, chunks): a long run's arrivals (zero between calls)
  int* run_cells;         // (vocab, chunks, 2): a long run's first and last cell
  int64_t n, cols, vocab, cells, chunks;
};

// What ends at an entry: nothing, a whole run (added into dtable), or a piece of a long run:
// its first (the owner's), a middle one (a whole cell) or its last.
enum : int8_t { kNotEnd = 0, kToTable = 1, kOwner = 2, kMiddle = 3, kLast = 4 };

// In a window of kWin sorted keys whose run starts are the set bits of `starts` (bit 0 always
// set): the first entry of the run holding entry w, and the end (exclusive) of that run, clipped
// to the window's wn entries.
static __device__ __forceinline__ int run_first(const unsigned* starts, int w) {
  int word = w >> 5;
  unsigned bits = starts[word] & (0xffffffffu >> (31 - (w & 31)));
  while (bits == 0) bits = starts[--word];
  return word * 32 + 31 - __clz(bits);
}
static __device__ __forceinline__ int run_end(const unsigned* starts, int w, int wn) {
  int word = w >> 5;
  unsigned bits = (w & 31) == 31 ? 0u : starts[word] & (0xfffffffeu << (w & 31));
  while (bits == 0 && ++word < kWinWords) bits = starts[word];
  return bits == 0 ? wn : std::min(wn, word * 32 + __ffs(bits) - 1);
}

// Loads N floats from L2 (bypassing L1: written by other blocks of this kernel).
template <int N>
static __device__ __forceinline__ void load_pack_cg(const float* p, float (&out)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int c = 0; c < N / 4; ++c) {
      const float4 u = __ldcg(reinterpret_cast<const float4*>(p) + c);
      out[4 * c] = u.x, out[4 * c + 1] = u.y, out[4 * c + 2] = u.z, out[4 * c + 3] = u.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = __ldcg(p + j);
  }
}

// Block blockIdx.x = cell * chunks + chunk, over the chunk's columns (blockDim.x packs of N, one
// per thread; the chunks of a cell are neighbours in the launch order, so a row's columns are
// read and written together). Cell c covers sorted entries [s, e) = [c kCell, (c + 1) kCell) and
// sums every run that starts there, whole, in token order, into dtable, also past e: a run of at
// most kLongRun entries is one block's. A longer run is summed in pieces, one per cell it
// crosses, each into its cell's slot; every piece then counts itself arrived on the run's counter
// (after a fence), and the block whose arrival completes the run adds the pieces in cell order
// into dtable. The counter needs no count of pieces: the owner (first) cell c0 adds c0 + 1, each
// middle cell 1, the last cell c1 adds -c1; only all of them together sum to 0.
// The block reads the keys of [s - kLongRun, e + kLongRun), enough to tell whether a run meeting
// the cell is long, and the tokens of [s, e + kLongRun); it walks its entries in order,
// kCellUnroll dout rows in flight per thread, the dtable rows of the runs ending among them
// loaded with them. Every branch around a barrier is uniform over the block (threads past the
// last column only skip the loads and stores). The long run's first and last cell are kept per
// chunk, written by that chunk's blocks before their arrivals, so the completing block reads
// them after its own chunk's arrivals.
template <typename T, int N>
static __global__ void __launch_bounds__(kCellThreads, kCellMinBlocks)
    embedding_cell_kernel(const EmbBwdParams<T> p) {
  wait_for_previous_kernel();
  constexpr int kSpan = kCell + kLongRun;  // the entries a block may sum, from s
  __shared__ uint32_t s_key[kWin];
  __shared__ int32_t s_tok[kSpan];
  __shared__ int8_t s_end[kSpan];
  __shared__ unsigned s_starts[kWinWords];
  __shared__ int s_first, s_stop;                 // entries [s + first, s + stop) are this block's
  __shared__ uint32_t s_piece_key[2];             // long pieces: [0] ends the cell's first run,
  __shared__ int s_piece_add[2], s_done;          // [1] the owner's; add 0: none
  const int lane = threadIdx.x & 31;
  const int64_t cell = blockIdx.x / p.chunks, chunk = blockIdx.x % p.chunks;
  const int64_t s = cell * kCell, e = std::min(p.n, s + kCell);
  const int64_t ws = std::max<int64_t>(0, s - kLongRun), we = std::min(p.n, e + kLongRun);
  const int wn = static_cast<int>(we - ws), lead = static_cast<int>(s - ws);
  if (threadIdx.x == 0) {
    s_first = kSpan;
    s_stop = 0;
    s_piece_add[0] = s_piece_add[1] = 0;
  }
  for (int w = threadIdx.x; w < kWin; w += blockDim.x)
    s_key[w] = w < wn ? p.keys[ws + w] : 0xffffffffu;  // past the window: no key (a run start)
  for (int r = threadIdx.x; r < kSpan; r += blockDim.x)
    s_tok[r] = s + r < we ? p.tokens[s + r] : 0;
  __syncthreads();
  for (int w = threadIdx.x; w < kWin; w += blockDim.x) {  // whole warps: kWin % 32 == 0
    const unsigned b = __ballot_sync(kFull, w == 0 || s_key[w] != s_key[w - 1]);
    if (lane == 0) s_starts[w >> 5] = b;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < kSpan; r += blockDim.x) {
    const int w = lead + r;
    const int64_t i = s + r;
    int8_t end = kNotEnd;
    bool mine = false;
    const uint32_t key = s_key[w];
    if (w < wn && key < p.vocab) {
      const int a = run_first(s_starts, w), b = run_end(s_starts, w, wn);
      const int64_t first = ws + a, stop = ws + b;  // exact for a run of at most kLongRun
      if (b - a <= kLongRun) {
        mine = first >= s && first < e;
        if (mine && i == stop - 1) end = kToTable;
      } else if (i < e) {
        mine = true;
        if (i == std::min(stop, e) - 1) {
          const bool owner = first >= s, last = stop <= e;
          end = owner ? kOwner : last ? kLast : kMiddle;
          const int q = owner ? 1 : 0;
          s_piece_key[q] = key;
          s_piece_add[q] = owner ? static_cast<int>(cell) + 1 : last ? -static_cast<int>(cell) : 1;
          int* cells_of = p.run_cells + 2 * (static_cast<int64_t>(key) * p.chunks + chunk);
          if (owner) cells_of[0] = static_cast<int>(cell);
          if (last) cells_of[1] = static_cast<int>(cell);
        }
      }
    }
    s_end[r] = end;
    const unsigned m = __ballot_sync(kFull, mine);  // whole warps: kSpan % 32 == 0
    if (lane == 0 && m != 0u) {
      atomicMin(&s_first, r + __ffs(m) - 1);
      atomicMax(&s_stop, r + 32 - __clz(m));
    }
  }
  __syncthreads();
  const int first = s_first, stop = s_stop;
  const int64_t col = (chunk * blockDim.x + threadIdx.x) * N;
  const bool active = col < p.cols;
  float sum[N];
#pragma unroll
  for (int j = 0; j < N; ++j) sum[j] = 0.f;
  for (int r0 = first; active && r0 < stop; r0 += kCellUnroll) {
    Pack<T, N> v[kCellUnroll];
    float d[kCellUnroll][N];
#pragma unroll
    for (int u = 0; u < kCellUnroll; ++u) {
      const int r = r0 + u;
      if (r < stop) {
        const T* row = p.dout + static_cast<int64_t>(s_tok[r]) * p.cols;
        v[u] = *reinterpret_cast<const Pack<T, N>*>(row + col);
        if (s_end[r] == kToTable)
          load_pack<float, N>(p.dtable + static_cast<int64_t>(s_key[lead + r]) * p.cols + col,
                              d[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kCellUnroll; ++u) {
      const int r = r0 + u;
      if (r < stop) {
#pragma unroll
        for (int j = 0; j < N; ++j) sum[j] += to_float(v[u].v[j]);
        const int8_t end = s_end[r];
        if (end != kNotEnd) {
          if (end == kToTable) {
#pragma unroll
            for (int j = 0; j < N; ++j) d[u][j] += sum[j];
            store_pack<float, N>(p.dtable + static_cast<int64_t>(s_key[lead + r]) * p.cols + col,
                                 d[u]);
          } else {
            float* slot = end == kOwner ? p.slot_own : p.slot_in;
            store_pack<float, N>(slot + cell * p.cols + col, sum);
          }
#pragma unroll
          for (int j = 0; j < N; ++j) sum[j] = 0.f;
        }
      }
    }
  }
  // The long pieces' arrivals, the cell's first run's before the owner's.
  for (int q = 0; q < 2; ++q) {
    const int add = s_piece_add[q];
    if (add == 0) continue;
    const int64_t key = s_piece_key[q];
    __threadfence();  // this block's slot (and run_cells) before its arrival
    __syncthreads();
    if (threadIdx.x == 0) {
      const int before = atomicAdd(&p.run_count[key * p.chunks + chunk], add);
      s_done = before + add == 0;
    }
    __syncthreads();
    if (!s_done) continue;
    __threadfence();
    const int* cells_of = p.run_cells + 2 * (key * p.chunks + chunk);
    const int64_t c0 = __ldcg(cells_of), c1 = __ldcg(cells_of + 1);
    if (threadIdx.x == 0) p.run_count[key * p.chunks + chunk] = 0;  // the last arrival: reset
    if (!active) continue;
    float* dst = p.dtable + key * p.cols + col;
    float acc[N], out[N];
    load_pack<float, N>(dst, out);
    load_pack_cg<N>(p.slot_own + c0 * p.cols + col, acc);
    for (int64_t c = c0 + 1; c <= c1; c += kCellUnroll) {
      float v[kCellUnroll][N];
#pragma unroll
      for (int u = 0; u < kCellUnroll; ++u)
        if (c + u <= c1) load_pack_cg<N>(p.slot_in + (c + u) * p.cols + col, v[u]);
#pragma unroll
      for (int u = 0; u < kCellUnroll; ++u)
        if (c + u <= c1) {
#pragma unroll
          for (int j = 0; j < N; ++j) acc[j] += v[u][j];
        }
    }
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] += acc[j];
    store_pack<float, N>(dst, out);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// ids (T) i32 (checked); returns T, below the flag's sentinel.
static int64_t check_ids(const Tensor& ids, const char* op) {
  ENSURE(ids.size(0) < kNoError, op, ": T = ", ids.size(0), " tokens is too many");
  return ids.size(0);
}

// The vocabulary size of a table of `rows` rows (the shard was checked): vocab_total, or rows
// when unsharded (0); below the flag's sentinel.
static int64_t vocab_of(int64_t rows, int64_t vocab_total, const char* op) {
  const int64_t total = vocab_total == 0 ? rows : vocab_total;
  ENSURE(total < kNoError, op, ": V = ", total, " is too large");
  return total;
}

// t in bf16 or f32.
static void expect_float(const Tensor& t, const char* op, const char* name) {
  ENSURE(t.dtype == DType::BF16 || t.dtype == DType::F32, op, ": ", name, " is ",
         dtype_name(t.dtype), ", expected bf16 or f32");
}

// The long runs' arrival counters, one per (row, column chunk): zeroed when allocated, and each
// reset by the block that completes its run, so they are all zero between calls (one device per
// process; calls are ordered on the compute stream).
static int* run_counters(size_t count) {
  static Buffer buf;
  if (buf.bytes() < count * sizeof(int)) {
    buf = Buffer(count * sizeof(int), Device::CUDA);
    CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, buf.bytes(), stream()));
  }
  return static_cast<int*>(buf.data());
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
  device::copy(&first, false, flag.data(), true, sizeof(int));
  if (first >= ids.size(0)) return;
  int32_t id = 0;
  device::copy(&id, false, static_cast<const int32_t*>(ids.data) + first, true, sizeof(int32_t));
  RAISE(op, ": ids[", first, "] = ", id, " out of range [0, ", vocab, ") (token position ", first,
        ")");
}

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin, int64_t vocab_total, ops::IdCheck check) {
  const char* op = "embedding_forward";
  const bool raise_bad_ids = check == ops::IdCheck::kRaise;
  const int64_t n = check_ids(ids, op);
  expect_float(table, op, "table");
  const int64_t rows = table.size(0), cols = table.size(1);
  const int64_t vocab = vocab_of(rows, vocab_total, op);
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
      launch_dependent(kernel, grid, threads, 0, pid, tab, po, n, vocab_begin, rows, vocab, cols,
                       err);
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
                        int64_t vocab_begin, int64_t vocab_total, ops::IdCheck check) {
  const char* op = "embedding_backward";
  const bool raise_bad_ids = check == ops::IdCheck::kRaise;
  const int64_t n = check_ids(ids, op);
  ENSURE(dtable.dtype == DType::F32, op, ": dtable is ", dtype_name(dtable.dtype),
         ", the kernel accumulates into f32");
  const int64_t rows = dtable.size(0), cols = dtable.size(1);
  const int64_t vocab = vocab_of(rows, vocab_total, op);
  expect_float(dout, op, "dout");
  if (n == 0) return;

  // The cells' columns: blocks of `threads` packs of `elems` columns, `chunks` per row.
  const int vec_elems = 16 / static_cast<int>(dtype_size(dout.dtype));
  const bool vec = cols % vec_elems == 0 && aligned16(dout.data) && aligned16(dtable.data);
  const int elems = vec ? vec_elems : 1;
  const int64_t packs = ceil_div(cols, elems);
  const int threads =
      static_cast<int>(std::clamp<int64_t>(ceil_div(packs, 32) * 32, 32, kCellThreads));
  const int64_t chunks = std::max<int64_t>(1, ceil_div(packs, threads));
  const int64_t cells = ceil_div(n, kCell);
  ENSURE(cells * chunks < (int64_t{1} << 31), op, ": T = ", n, " x C = ", cols, " is too large");

  Buffer flag = raise_bad_ids ? error_flag() : Buffer{};
  int* err = static_cast<int*>(flag.data());
  // Keys and values, double-buffered for the sort passes; the long runs' counters and cells.
  Buffer sort_buf(4 * static_cast<size_t>(n) * sizeof(int32_t), Device::CUDA);
  uint32_t* keys[2] = {static_cast<uint32_t*>(sort_buf.data()),
                       static_cast<uint32_t*>(sort_buf.data()) + n};
  int32_t* vals[2] = {static_cast<int32_t*>(sort_buf.data()) + 2 * n,
                      static_cast<int32_t*>(sort_buf.data()) + 3 * n};
  Buffer run_buf(static_cast<size_t>(rows) * chunks * 2 * sizeof(int), Device::CUDA);
  int* run_cells = static_cast<int*>(run_buf.data());
  int* run_count = run_counters(static_cast<size_t>(rows) * chunks);
  const int32_t* pid = static_cast<const int32_t*>(ids.data);
  const int bits = std::bit_width(static_cast<uint64_t>(rows));  // keys are <= rows
  const int passes = std::max(1, static_cast<int>(ceil_div(bits, kDigitBits)));
  const int64_t tiles = ceil_div(n, kSortTile);
  const bool short_sort = tiles <= kShortSortTiles;
  Buffer hist_buf(static_cast<size_t>(passes) * kDigits * tiles * sizeof(int), Device::CUDA);
  int* hist = static_cast<int*>(hist_buf.data());
  launch_dependent(radix_first_hist_kernel, static_cast<unsigned>(tiles), kSortTile, 0, pid, n,
                   vocab_begin, rows, vocab, tiles, passes, short_sort, hist);
  check_launch("radix_first_hist_kernel");
  for (int q = 0; q < passes; ++q) {
    int* h = hist + static_cast<int64_t>(q) * kDigits * tiles;
    SortPass sp{};
    sp.keys_in = q == 0 ? nullptr : keys[(q - 1) & 1];
    sp.vals_in = q == 0 ? nullptr : vals[(q - 1) & 1];
    sp.ids = pid;
    sp.keys_out = keys[q & 1];
    sp.vals_out = vals[q & 1];
    sp.hist = h;
    sp.next_hist = q + 1 < passes ? h + kDigits * tiles : nullptr;
    sp.err = err;
    sp.n = n;
    sp.tiles = tiles;
    sp.begin = vocab_begin;
    sp.rows = rows;
    sp.vocab = vocab;
    sp.shift = q * kDigitBits;
    const unsigned grid = static_cast<unsigned>(tiles);
    if (short_sort) {
      launch_dependent(radix_scatter_kernel<kCountsRead>, grid, kSortTile, 0, sp);
    } else {
      launch_dependent(exclusive_scan_kernel, 1, kScanThreads, 0, h, int64_t{kDigits} * tiles);
      check_launch("exclusive_scan_kernel");
      launch_dependent(radix_scatter_kernel<kScanned>, grid, kSortTile, 0, sp);
    }
    check_launch("radix_scatter_kernel");
  }
  const int last = (passes - 1) & 1;

  if (cols > 0) {
    Buffer slots(2 * static_cast<size_t>(cells) * cols * sizeof(float), Device::CUDA);
    float_switch(dout.dtype, [&](auto tag) {
      using T = decltype(tag);
      EmbBwdParams<T> p{};
      p.dout = static_cast<const T*>(dout.data);
      p.dtable = static_cast<float*>(dtable.data);
      p.keys = keys[last];
      p.tokens = vals[last];
      p.slot_own = static_cast<float*>(slots.data());
      p.slot_in = p.slot_own + cells * cols;
      p.run_count = run_count;
      p.run_cells = run_cells;
      p.n = n;
      p.cols = cols;
      p.vocab = rows;
      p.cells = cells;
      p.chunks = chunks;
      constexpr int V = 16 / sizeof(T);
      auto kernel = vec ? embedding_cell_kernel<T, V> : embedding_cell_kernel<T, 1>;
      launch_dependent(kernel, static_cast<unsigned>(cells * chunks), threads, 0, p);
      check_launch("embedding_cell_kernel");
    });
  }
  if (raise_bad_ids) raise_if_bad_id(flag, ids, vocab, op);
}

}  // namespace engine::cuda
