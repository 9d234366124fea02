// A small CPU emulator for the flash-attention kernels (include before the kernel headers):
// the same kernel source (flash_fwd.cuh, flash_bwd.cuh) compiled by g++ with FLASH_EMULATE and
// run on the host, each CUDA thread a fiber (ucontext). Threads switch only at
// synchronisation points (__syncthreads, __syncwarp and the warp collectives: shuffles,
// ldmatrix, mma.sync), and the threads of a block run in a fresh random order between them,
// so a missing barrier shows up as wrong results; warps also run at random speeds, some far
// behind the others between barriers. Collectives follow their PTX definitions
// (ldmatrix.x4 with .trans, mma.sync.m16n8k16 bf16 -> f32, shfl). cp.async copies land either
// at issue or only at cp.async.wait_group (two modes: a read before the wait, or a copy into
// a buffer that another warp may still read, breaks one of them). Shared memory starts as
// 0xff bytes (bf16 NaN), so reading anything never written shows up too. Deadlocks (a
// barrier or collective some threads never reach) abort with a message. Bulk reductions
// (cp.reduce.async.bulk .add.f32, shared -> global) read their shared source at issue or only
// at the issuing thread's cp.async.bulk.wait_group (the same two modes), and abort when the
// source was written (st.shared through the wrapper) by a thread that had not executed
// fence.proxy.async before the last barrier, or when a thread exits with bulk copies pending.
// Not fast: for tests of a few hundred tokens.
#pragma once
#define FLASH_EMULATE 1

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

// ---- CUDA spellings --------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // one copy for all fibers; blocks run one after another

struct __nv_bfloat16 {
  uint16_t x;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct uint2 {
  uint32_t x, y;
};
struct uint4 {
  uint32_t x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float __bfloat162float(__nv_bfloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16(a), __float2bfloat16(b)};
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

enum class CopyMode { kAtIssue, kAtWait };

struct Copy {
  unsigned char* dst;
  const void* src;
  int bytes;
  bool valid;
};

struct BulkReduce {  // cp.reduce.async.bulk .add.f32, shared -> global
  float* dst;
  uint32_t src, bytes;
  bool committed;
};
inline void do_bulk(const BulkReduce& r);

struct Thread {
  ucontext_t ctx;
  std::vector<char> stack;
  Dim3 tid;
  int linear = 0;
  bool done = false;
  std::vector<Copy> pending;
  std::vector<BulkReduce> bulk;
  bool unfenced = false;             // wrote shared memory for the async proxy, no fence since
  bool unfenced_at_barrier = false;  // ... as of its last __syncthreads
};

struct Rendezvous {  // one warp's collective in progress
  int arrived = 0;
  uint64_t gen = 0;
  int kind = -1;
  uint32_t in[32][10];
  uint32_t out[32][4];
};

struct Block {
  Dim3 idx, grid;
  std::vector<unsigned char> smem;
  int live = 0;
  int bar_arrived = 0;
  uint64_t bar_gen = 0;
  std::vector<Rendezvous> warps;
  std::vector<int> warp_live;
};

struct State {
  Block* block = nullptr;
  Thread* cur = nullptr;
  ucontext_t sched;
  uint64_t progress = 0;
  CopyMode mode = CopyMode::kAtWait;
  std::mt19937 rng{12345};
  std::function<void()> body;
  std::vector<Thread>* threads = nullptr;  // of the running block
  std::vector<std::pair<const char*, size_t>> global;  // buffers cp.async and atomics may touch
};
inline State& st() {
  static State s;
  return s;
}

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "flash emulator: %s\n", what);
  std::abort();
}

// The only callers of swapcontext (it returns twice, which would otherwise trip -Wclobbered).
[[gnu::noinline]] inline void yield() { swapcontext(&st().cur->ctx, &st().sched); }
[[gnu::noinline]] inline void resume(ucontext_t* ctx) { swapcontext(&st().sched, ctx); }

inline void syncthreads() {
  Block& b = *st().block;
  st().cur->unfenced_at_barrier = st().cur->unfenced;
  const uint64_t gen = b.bar_gen;
  ++st().progress;
  if (++b.bar_arrived == b.live) {
    b.bar_arrived = 0;
    ++b.bar_gen;
  } else {
    while (b.bar_gen == gen) yield();
  }
}

// All live lanes of the calling warp deposit `in`; the last to arrive runs compute(r), then
// each lane takes its row of r.out.
inline void collective(int kind, const uint32_t* in, int nin, uint32_t* out, int nout,
                       const std::function<void(Rendezvous&)>& compute) {
  Block& b = *st().block;
  const int w = st().cur->linear / 32, lane = st().cur->linear % 32;
  Rendezvous& r = b.warps[w];
  if (r.arrived == 0)
    r.kind = kind;
  else if (r.kind != kind)
    die("lanes of one warp are in different collectives");
  std::memcpy(r.in[lane], in, sizeof(uint32_t) * nin);
  const uint64_t gen = r.gen;
  ++st().progress;
  if (++r.arrived == b.warp_live[w]) {
    if (b.warp_live[w] != 32) die("collective with an incomplete warp");
    compute(r);
    r.arrived = 0;
    ++r.gen;
  } else {
    while (r.gen == gen) yield();
  }
  std::memcpy(out, r.out[lane], sizeof(uint32_t) * nout);
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float lo_bf16(uint32_t r) { return __bfloat162float({static_cast<uint16_t>(r & 0xffff)}); }
inline float hi_bf16(uint32_t r) { return __bfloat162float({static_cast<uint16_t>(r >> 16)}); }

inline uint16_t smem_u16(uint32_t addr) {
  Block& b = *st().block;
  if (addr % 2 != 0 || addr + 2 > b.smem.size()) die("shared memory read out of bounds");
  uint16_t v;
  std::memcpy(&v, b.smem.data() + addr, 2);
  return v;
}

inline void ldmatrix(uint32_t (&r)[4], uint32_t addr, bool trans) {
  uint32_t in[1] = {addr};
  collective(trans ? 1 : 2, in, 1, r, 4, [trans](Rendezvous& z) {
    for (int q = 0; q < 4; ++q) {
      auto m = [&](int row, int col) {
        const uint32_t a = z.in[8 * q + row][0];
        if (a % 16 != 0) die("ldmatrix row address not 16-byte aligned");
        return static_cast<uint32_t>(smem_u16(a + 2 * col));
      };
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        z.out[l][q] = trans ? (m(2 * t, g) | m(2 * t + 1, g) << 16)
                            : (m(g, 2 * t) | m(g, 2 * t + 1) << 16);
      }
    }
  });
}

inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  uint32_t in[10] = {a[0], a[1], a[2], a[3], b0, b1, bits(d[0]), bits(d[1]), bits(d[2]), bits(d[3])};
  uint32_t out[4];
  collective(3, in, 10, out, 4, [](Rendezvous& z) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const uint32_t* f = z.in[l];
      A[g][2 * t] = lo_bf16(f[0]), A[g][2 * t + 1] = hi_bf16(f[0]);
      A[g + 8][2 * t] = lo_bf16(f[1]), A[g + 8][2 * t + 1] = hi_bf16(f[1]);
      A[g][2 * t + 8] = lo_bf16(f[2]), A[g][2 * t + 9] = hi_bf16(f[2]);
      A[g + 8][2 * t + 8] = lo_bf16(f[3]), A[g + 8][2 * t + 9] = hi_bf16(f[3]);
      B[2 * t][g] = lo_bf16(f[4]), B[2 * t + 1][g] = hi_bf16(f[4]);
      B[2 * t + 8][g] = lo_bf16(f[5]), B[2 * t + 9][g] = hi_bf16(f[5]);
    }
    for (int l = 0; l < 32; ++l)
      for (int e = 0; e < 4; ++e) {
        const int row = l / 4 + 8 * (e / 2), col = 2 * (l % 4) + e % 2;
        double acc = from_bits(z.in[l][6 + e]);
        for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
        z.out[l][e] = bits(static_cast<float>(acc));
      }
  });
  for (int e = 0; e < 4; ++e) d[e] = from_bits(out[e]);
}

inline float shfl(float v, int src_lane, bool xor_mode) {
  uint32_t in[2] = {bits(v), static_cast<uint32_t>(src_lane)};
  uint32_t out[1];
  collective(xor_mode ? 4 : 5, in, 2, out, 1, [xor_mode](Rendezvous& z) {
    for (int l = 0; l < 32; ++l) {
      const int s = xor_mode ? (l ^ static_cast<int>(z.in[l][1])) : static_cast<int>(z.in[l][1]);
      z.out[l][0] = z.in[s & 31][0];
    }
  });
  return from_bits(out[0]);
}

inline void syncwarp() {
  uint32_t in[1] = {0}, out[1];
  collective(6, in, 1, out, 1, [](Rendezvous&) {});
}

inline void do_copy(const Copy& c) {
  if (c.valid)
    std::memcpy(c.dst, c.src, c.bytes);
  else
    std::memset(c.dst, 0, c.bytes);
}

// Declares [p, p + bytes) as device memory the kernels may read with cp.async or add into.
inline void allow_global(const void* p, size_t bytes) {
  st().global.emplace_back(static_cast<const char*>(p), bytes);
}
inline void check_global(const void* p, int bytes, const char* what) {
  const char* c = static_cast<const char*>(p);
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) die(what);
  for (const auto& [base, size] : st().global)
    if (c >= base && c + bytes <= base + size) return;
  die(what);
}

inline void cp_async(uint32_t dst, const void* src, int bytes, bool valid) {
  Block& b = *st().block;
  if (dst % bytes != 0 || dst + bytes > b.smem.size()) die("cp.async destination out of bounds");
  check_global(src, bytes, "cp.async source misaligned or outside the tensors");
  const Copy c{b.smem.data() + dst, src, bytes, valid};
  if (st().mode == CopyMode::kAtIssue)
    do_copy(c);
  else
    st().cur->pending.push_back(c);
}

inline void cp_async_wait() {
  for (const Copy& c : st().cur->pending) do_copy(c);
  st().cur->pending.clear();
}

// cp.async.bulk.commit_group / wait_group(.read) 0: the committed bulk copies of the thread.
inline void bulk_commit() {
  for (auto& r : st().cur->bulk) r.committed = true;
}
inline void bulk_wait() {
  auto& v = st().cur->bulk;
  for (const auto& r : v)
    if (r.committed) do_bulk(r);
  v.erase(std::remove_if(v.begin(), v.end(), [](const auto& r) { return r.committed; }), v.end());
}

// st.shared.v2.f32: a store the copy engine may read (marks the thread as needing a fence).
inline void st_shared_f32x2(uint32_t addr, float a, float b) {
  Block& blk = *st().block;
  if (addr % 8 != 0 || addr + 8 > blk.smem.size()) die("st.shared.v2.f32 out of bounds");
  std::memcpy(blk.smem.data() + addr, &a, 4);
  std::memcpy(blk.smem.data() + addr + 4, &b, 4);
  st().cur->unfenced = true;
}

inline void fence_proxy_async() { st().cur->unfenced = false; }

inline void do_bulk(const BulkReduce& r) {
  const unsigned char* src = st().block->smem.data() + r.src;
  for (uint32_t i = 0; i < r.bytes / 4; ++i) {
    float v;
    std::memcpy(&v, src + 4 * i, 4);
    r.dst[i] += v;
  }
}

inline void bulk_reduce_add(float* dst, uint32_t src, uint32_t bytes) {
  Block& b = *st().block;
  if (bytes == 0 || bytes % 16 != 0) die("bulk reduction size not a positive multiple of 16");
  if (src % 16 != 0 || src + bytes > b.smem.size()) die("bulk reduction source out of bounds");
  const char* d = reinterpret_cast<const char*>(dst);
  bool inside = false;
  for (const auto& [base, size] : st().global) inside |= d >= base && d + bytes <= base + size;
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || !inside)
    die("bulk reduction destination misaligned or outside the tensors");
  // The issue follows a barrier after the stores it reads: every thread must have reached that
  // barrier with those stores fenced for the async proxy.
  for (const Thread& t : *st().threads)
    if (t.unfenced_at_barrier)
      die("bulk reduction of shared memory stored without fence.proxy.async");
  const BulkReduce r{dst, src, bytes, false};
  if (st().mode == CopyMode::kAtIssue)
    do_bulk(r);
  else
    st().cur->bulk.push_back(r);
}

inline void thread_entry() {
  st().body();
  Thread& t = *st().cur;
  if (!t.pending.empty()) die("thread exits with cp.async copies never waited for");
  if (!t.bulk.empty()) die("thread exits with bulk copies never waited for");
  t.done = true;
  --st().block->live;
  --st().block->warp_live[t.linear / 32];
  ++st().progress;
  // returns to st().sched through uc_link
}

[[gnu::noinline]] inline void make_fiber(Thread& t) {
  getcontext(&t.ctx);
  t.ctx.uc_stack.ss_sp = t.stack.data();
  t.ctx.uc_stack.ss_size = t.stack.size();
  t.ctx.uc_link = &st().sched;
  makecontext(&t.ctx, thread_entry, 0);
}

// Runs body() as every thread of every block of the grid (blocks one after another).
inline void launch(Dim3 grid, int threads, size_t smem_bytes, std::function<void()> body,
                   CopyMode mode) {
  State& s = st();
  s.body = std::move(body);
  s.mode = mode;
  std::vector<Thread> ts(threads);
  for (Thread& t : ts) t.stack.resize(256 * 1024);
  s.threads = &ts;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block b;
        b.idx = {x, y, z};
        b.grid = grid;
        b.smem.assign(smem_bytes, 0xff);
        b.live = threads;
        b.warps.resize((threads + 31) / 32);
        b.warp_live.assign(b.warps.size(), 32);
        s.block = &b;
        for (int i = 0; i < threads; ++i) {
          Thread& t = ts[i];
          t.tid = {static_cast<unsigned>(i), 0, 0};
          t.linear = i;
          t.done = false;
          t.pending.clear();
          t.bulk.clear();
          t.unfenced = t.unfenced_at_barrier = false;
          make_fiber(t);
        }
        std::vector<int> order(threads);
        for (int i = 0; i < threads; ++i) order[i] = i;
        // Rounds: every thread that runs goes on to its next synchronisation point. Warps run
        // at random speeds (redrawn every 64 rounds; some warps fall far behind the others
        // between barriers, which exposes a missing barrier even where the writes it should
        // wait for come early in a phase). A round without progress is repeated with every
        // warp running; only such a round without progress is a deadlock.
        const int nwarps = (threads + 31) / 32;
        std::vector<double> speed(nwarps, 1.0);
        std::vector<bool> runs(nwarps, true);
        std::uniform_real_distribution<double> u01(0.0, 1.0);
        bool full = false;
        for (uint64_t round = 0;; ++round) {
          bool all_done = true;
          const uint64_t before = s.progress;
          if (round % 64 == 0)
            for (double& v : speed) {
              const double x = u01(s.rng);
              v = x < 0.5 ? 1.0 : x < 0.75 ? 0.5 : 0.05;
            }
          for (int w = 0; w < nwarps; ++w) runs[w] = full || u01(s.rng) < speed[w];
          std::shuffle(order.begin(), order.end(), s.rng);
          for (int i : order) {
            if (ts[i].done) continue;
            all_done = false;
            if (!runs[i / 32]) continue;
            s.cur = &ts[i];
            resume(&ts[i].ctx);
          }
          if (all_done) break;
          if (s.progress == before && full)
            die("deadlock: threads wait at a barrier others never reach");
          full = s.progress == before;
        }
        s.block = nullptr;
      }
}

}  // namespace emu

#define threadIdx (::emu::st().cur->tid)
#define blockIdx (::emu::st().block->idx)
#define gridDim (::emu::st().block->grid)
inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp() { emu::syncwarp(); }
inline float __shfl_xor_sync(unsigned, float v, int m) { return emu::shfl(v, m, true); }
inline float __shfl_sync(unsigned, float v, int src) { return emu::shfl(v, src, false); }
inline float atomicAdd(float* p, float v) {
  emu::check_global(p, 4, "atomicAdd outside the tensors");
  const float old = *p;
  *p = old + v;
  return old;
}

// The wrappers flash_common.cuh defines with PTX.
namespace engine::cuda::flash {
#define FLASH_DYNAMIC_SMEM(name) unsigned char* name = ::emu::st().block->smem.data()
#define FLASH_UNROLL
inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - ::emu::st().block->smem.data());
}
inline void cp_async_16(uint32_t dst, const void* src, bool valid) { emu::cp_async(dst, src, 16, valid); }
inline void cp_async_4(uint32_t dst, const void* src, bool valid) { emu::cp_async(dst, src, 4, valid); }
inline void cp_async_commit() {}
inline int thread_x() { return static_cast<int>(threadIdx.x); }
inline void cp_async_wait_all() { emu::cp_async_wait(); }
inline void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  emu::bulk_reduce_add(dst, src, bytes);
}
inline void bulk_commit() { emu::bulk_commit(); }
inline void bulk_wait_read() { emu::bulk_wait(); }
inline void bulk_wait() { emu::bulk_wait(); }
inline void fence_proxy_async() { emu::fence_proxy_async(); }
inline void st_shared_f32x2(uint32_t addr, float a, float b) { emu::st_shared_f32x2(addr, a, b); }
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, true); }
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma(d, a, b0, b1);
}
inline float ex2(float x) { return std::exp2(x); }  // cuda/common/fast_math.cuh
}  // namespace engine::cuda::flash
