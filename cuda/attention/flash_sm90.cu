// Flash attention forward on Hopper (sm_90a): wgmma, TMA and warp specialisation (FlashAttention-3
// style), head dims 64 and 128, the contract of flash_fwd.cuh (same out, same lse) for qkv's own
// keys (no separate kv: the launcher keeps that case on the mma.sync kernel).
//
// Block: kBlockM = 128 query rows of one (q head h, sequence s): two consumer warpgroups of 64
// rows each (warps 0-7, 240 registers per thread by setmaxnreg) and a producer warpgroup (warps
// 8-11, 24 registers) of which one thread issues every copy. The producer loads the Q tile
// once and then the K and V tiles of kBlockN = 128 keys, from the last visible key tile down to
// the first (causal: the diagonal tile first), into a 2-stage ring, all by TMA; stage s has the
// barriers k_full[s] and v_full[s] (the tile's bytes have landed), k_empty[s] and v_empty[s] (one
// arrival per consumer warpgroup once its wgmma reading K[s], V[s] have retired): K[s] is free
// again as soon as S is done, so the next K tile lands a whole tile ahead.
// qkv is one 3-D tensor map: (64 elements, (H + 2 Hkv) D / 64 column blocks, T tokens), box
// (64, 1, rows) in the 128-byte swizzle (cuda/common/sm90.cuh): a tile of `rows` tokens x D is
// D / 64 boxes, column block c at c * rows * 128 bytes. Rows past T are zero-filled; rows past
// the sequence's end inside T (the next sequence's) are loaded, their keys masked (-inf) and
// their query rows never stored.
//
// Consumer warpgroup (64 rows; thread = the wgmma accumulator fragment: warp w of the group rows
// 16 w + lane / 4 and + 8, columns 8 j + 2 (lane % 4) and + 1 of every n8 block j):
//   S = Q K^T   wgmma m64n128k16, A = Q and B = K from shared memory (both K-major), D / 16 steps
//   online softmax in registers as flash_fwd.cuh (exp2 with scale * log2(e) folded in)
//   O += P V    wgmma m64nDk16, A = P from registers (bf16, the accumulator layout of S is the A
//               fragment layout), B = V from shared memory MN-major (transposed), 128 / 16 steps
// Within a warpgroup the S product of tile i + 1 is issued before the P V product of tile i and
// the softmax of tile i + 1 runs while P V is in flight (only the rescale of O waits for it);
// the two warpgroups overlap each other's softmax and products on the tensor cores as they come.
// Masks only where a tile crosses the diagonal, the window edge or the sequence's end; tiles
// wholly invisible are never loaded. The epilogue stores O (bf16, rows inside the sequence) and
// lse straight from the registers.
//
// Shared memory: Q 128 x D, 2 stages of K and V 128 x D each: 160 KiB (D = 128) / 80 KiB (D = 64)
// + barriers; one block per SM (384 threads).
#include "cuda/attention/flash_common.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/sm90.cuh"

namespace engine::cuda::flash {
namespace {

template <int kD>
struct Sm90Config {
  static constexpr int kBlockM = 128, kBlockN = 128;
  static constexpr int kConsumers = kBlockM / 64;  // warpgroups
  static constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup
  // Registers per thread after setmaxnreg (the block is compiled for 65536 / 384 = 168).
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "register file");
  static constexpr int kStages = 2;
  static constexpr int kColBlocks = kD / 64;         // 64-column boxes per tile
  static constexpr uint32_t kQBytes = kBlockM * kD * 2, kKBytes = kBlockN * kD * 2;
  static constexpr uint32_t kBarOffset = kQBytes + kStages * 2 * kKBytes;
  static constexpr size_t kSmemBytes = kBarOffset + 8 * (1 + 4 * kStages) + 1024;  // + align slack
};

// What the kernel reads besides the tensor map (by value, small).
struct Sm90Params {
  bf16* out;                  // (T, H, D)
  float* lse;                 // (T, H)
  const int32_t* cu_seqlens;  // (S + 1)
  int num_heads, num_kv_heads;
  float scale;
  int window;
  bool causal;
};

#ifdef ENGINE_SM90A
using namespace sm90;

// d (64 x 128 f32) (+)= A (64 x 16, descriptor a) B (16 x 128, descriptor b), both K-major in
// shared memory; accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

// d (64 x 128 f32) += A (64 x 16, bf16 pairs in registers: the accumulator layout of a k16 slice)
// B (16 x 128, descriptor b, MN-major in shared memory: transposed).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// d (64 x 64 f32) += A (64 x 16, bf16 pairs in registers: the accumulator layout of a k16 slice)
// B (16 x 64, descriptor b, MN-major in shared memory: transposed).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}


template <int kD>
__device__ __forceinline__ void wgmma_pv(float (&o)[kD / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kD == 128)
    wgmma_m64n128k16_rs(o, a, b);
  else
    wgmma_m64n64k16_rs(o, a, b);
}
#endif  // ENGINE_SM90A

template <int kD>
__global__ void __launch_bounds__(Sm90Config<kD>::kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ CUtensorMap map, const Sm90Params p) {
#ifdef ENGINE_SM90A
  using C = Sm90Config<kD>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kColBlocks = C::kColBlocks;
  constexpr int kStages = C::kStages;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base;
  auto sK = [&](int s) { return base + C::kQBytes + s * 2 * C::kKBytes; };
  auto sV = [&](int s) { return base + C::kQBytes + s * 2 * C::kKBytes + C::kKBytes; };
  const uint32_t q_full = base + C::kBarOffset;
  auto k_full = [&](int s) { return q_full + 8 + 8 * s; };
  auto v_full = [&](int s) { return q_full + 8 + 8 * kStages + 8 * s; };
  auto k_empty = [&](int s) { return q_full + 8 + 16 * kStages + 8 * s; };
  auto v_empty = [&](int s) { return q_full + 8 + 24 * kStages + 8 * s; };

  const int h = blockIdx.x, seq = blockIdx.y;
  const int m_block = gridDim.z - 1 - blockIdx.z;  // the longest causal rows of all heads first
  const int seq_begin = p.cu_seqlens[seq];
  const int L = p.cu_seqlens[seq + 1] - seq_begin;
  const int m0 = m_block * kBlockM;
  if (m0 >= L) return;
  const int H = p.num_heads, Hkv = p.num_kv_heads, kv = h / (H / Hkv);
  const int key_lo = p.window > 0 ? max(0, m0 - p.window + 1) : 0;
  const int key_hi = p.causal ? min(L, m0 + kBlockM) : L;
  const int n_first = key_lo / kBlockN, n_last = (key_hi - 1) / kBlockN;
  const int n_tiles = n_last - n_first + 1;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), C::kConsumers);
      mbar_init(v_empty(s), C::kConsumers);
    }
    mbar_init_fence();
    fence_proxy_async();
  }
  __syncthreads();

  if (warp >= 4 * C::kConsumers) {  // producer warpgroup: warp 4 kConsumers, lane 0 issues
    setmaxnreg_dec<C::kProducerRegs>();
    if (warp == 4 * C::kConsumers && lane == 0) {
      mbar_expect_tx(q_full, C::kQBytes);
      for (int c = 0; c < kColBlocks; ++c)
        tma_load_3d(sQ + c * kBlockM * 128, &map, 0, h * kColBlocks + c, seq_begin + m0, q_full);
      const int k_col = (H + kv) * kColBlocks, v_col = (H + Hkv + kv) * kColBlocks;
      for (int i = 0; i < n_tiles; ++i) {
        const int s = i % kStages;
        const int key0 = seq_begin + (n_last - i) * kBlockN;
        if (i >= kStages) mbar_wait(k_empty(s), ((i / kStages) - 1) & 1);
        mbar_expect_tx(k_full(s), C::kKBytes);
        for (int c = 0; c < kColBlocks; ++c)
          tma_load_3d(sK(s) + c * kBlockN * 128, &map, 0, k_col + c, key0, k_full(s));
        if (i >= kStages) mbar_wait(v_empty(s), ((i / kStages) - 1) & 1);
        mbar_expect_tx(v_full(s), C::kKBytes);
        for (int c = 0; c < kColBlocks; ++c)
          tma_load_3d(sV(s) + c * kBlockN * 128, &map, 0, v_col + c, key0, v_full(s));
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<C::kConsumerRegs>();
  const int wg = warp >> 2, wq = warp & 3;
  const int row_base = wg * 64 + wq * 16 + (lane >> 2);  // tile row of fragment rows hf = 0 (+ 8)
  const float c = p.scale * kLog2e;
  // Q of this warpgroup: column block kk / 4 at kk / 4 * kBlockM * 128, rows 64 wg on.
  auto q_desc = [&](int kk) {
    return smem_desc_sw128(sQ + (kk >> 2) * kBlockM * 128 + wg * 64 * 128 + (kk & 3) * 32, 16);
  };
  auto k_desc = [&](int s, int kk) {
    return smem_desc_sw128(sK(s) + (kk >> 2) * kBlockN * 128 + (kk & 3) * 32, 16);
  };
  auto v_desc = [&](int s, int kk) { return smem_desc_sw128(sV(s) + kk * 2048, kBlockN * 128); };

  float o[kD / 2];
  float sc[kBlockN / 2];
  uint32_t pa[kBlockN / 16][4];
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;

  // S = Q K[s]^T, issued (not waited for).
  auto issue_s = [&](int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_m64n128k16_ss(sc, q_desc(kk), k_desc(s, kk), kk > 0);
    wgmma_commit();
  };
  auto issue_pv = [&](int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) wgmma_pv<kD>(o, pa[kk], v_desc(s, kk));
    wgmma_commit();
  };
  // Masks tile n of S, softmax numerators into sc, returns alpha (per row half) via m_run / l_run
  // updates; O is not touched (rescaled by the caller once P V is done).
  auto softmax = [&](int n, float (&alpha)[2]) {
    const int n0 = n * kBlockN;
    const bool need_mask = n0 + kBlockN > L || (p.causal && n0 + kBlockN - 1 > m0) ||
                           (p.window > 0 && m0 + kBlockM - 1 - n0 >= p.window);
    if (need_mask) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + row_base + 8 * hf;
        const int hi = (p.causal ? min(i + 1, L) : L) - n0;
        const int lo = (p.window > 0 ? i - p.window + 1 : 0) - n0;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int col = j * 8 + 2 * (lane & 3) + x;
            if (col >= hi || col < lo) sc[4 * j + 2 * hf + x] = -INFINITY;
          }
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = m_run[hf];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
        mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * hf], sc[4 * j + 2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_scaled = mx == -INFINITY ? 0.f : mx * c;
      alpha[hf] = fast_exp2(m_run[hf] * c - m_scaled);
      m_run[hf] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const float pe = fast_exp2(fmaf(sc[4 * j + 2 * hf + x], c, -m_scaled));
          sc[4 * j + 2 * hf + x] = pe;
          sum += pe;
        }
      l_run[hf] = l_run[hf] * alpha[hf] + sum;
    }
  };
  auto to_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pa[kk][0] = pack_bf16(sc[8 * kk + 0], sc[8 * kk + 1]);
      pa[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };
  const bool leader = (tid & 127) == 0;

  mbar_wait(q_full, 0);
  mbar_wait(k_full(0), 0);
  issue_s(0);
  wgmma_wait<0>();
  reg_fence(sc);
  if (leader) mbar_arrive(k_empty(0));
  {
    float alpha[2];
    softmax(n_last, alpha);
  }
  to_p();
  for (int i = 1; i < n_tiles; ++i) {
    const int s = i % kStages, prev = (i - 1) % kStages;
    mbar_wait(k_full(s), (i / kStages) & 1);
    issue_s(s);
    mbar_wait(v_full(prev), ((i - 1) / kStages) & 1);
    issue_pv(prev);
    wgmma_wait<1>();  // S of tile i is done, P V of tile i - 1 may still run
    reg_fence(sc);
    if (leader) mbar_arrive(k_empty(s));
    float alpha[2];
    softmax(n_last - i, alpha);
    wgmma_wait<0>();
    reg_fence(o);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) reg_fence(pa[kk]);
    if (leader) mbar_arrive(v_empty(prev));
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[4 * j + 0] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    to_p();
  }
  {
    const int last = (n_tiles - 1) % kStages;
    mbar_wait(v_full(last), ((n_tiles - 1) / kStages) & 1);
    issue_pv(last);
    wgmma_wait<0>();
    reg_fence(o);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) reg_fence(pa[kk]);
  }

  // Epilogue: normalise, lse, store the rows inside the sequence.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = l_run[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int i = m0 + row_base + 8 * hf;
    if (i < L) {
      const int64_t t = seq_begin + static_cast<int64_t>(i);
      if ((lane & 3) == 0) p.lse[t * H + h] = m_run[hf] * p.scale + logf(l);
      bf16* dst = p.out + (t * H + h) * kD + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) =
            pack_bf16(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
    }
  }
#endif  // ENGINE_SM90A
}

template <int kD>
bool kernel_ready() {
  static const bool ok = [] {
    if (!sm90::sm90_kernel_runs(reinterpret_cast<const void*>(flash_fwd_sm90_kernel<kD>)) ||
        sm90::tensor_map_encoder() == nullptr)
      return false;
    CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_sm90_kernel<kD>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(Sm90Config<kD>::kSmemBytes)));
    return true;
  }();
  return ok;
}

template <int kD>
void launch(const Params& p, const Grid& g, cudaStream_t stream) {
  using C = Sm90Config<kD>;
  // qkv as (64 elements, column blocks of all heads, T tokens): strides in bytes.
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(p.q_row / 64),
                              static_cast<cuuint64_t>(p.num_tokens)};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(p.q_row) * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(C::kBlockM)};
  const cuuint32_t elem[3] = {1, 1, 1};
  static_assert(C::kBlockM == C::kBlockN, "one box shape for Q, K and V tiles");
  CUtensorMap map;
  const CUresult r = sm90::tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(p.q), dims, strides, box, elem,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ENSURE(r == CUDA_SUCCESS, "attention_forward (sm90): cuTensorMapEncodeTiled failed (",
         static_cast<int>(r), ")");
  const Sm90Params kp{p.out, p.lse, p.cu_seqlens_q, p.num_heads, p.num_kv_heads, p.scale,
                      p.window, p.causal};
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(g.num_seqs),
                  static_cast<unsigned>(ceil_div(g.max_seqlen_q, C::kBlockM)));
  flash_fwd_sm90_kernel<kD><<<grid, C::kThreads, C::kSmemBytes, stream>>>(map, kp);
  check_launch("flash_fwd_sm90_kernel");
}

}  // namespace

bool flash_fwd_sm90_available(int head_dim) {
  if (head_dim == 64) return kernel_ready<64>();
  if (head_dim == 128) return kernel_ready<128>();
  return false;
}

bool flash_fwd_sm90_eligible(const Params& p, const Grid& g) {
  return (p.head_dim == 64 || p.head_dim == 128) && p.k == p.q + p.num_heads * p.head_dim &&
         p.kv_row == p.q_row && p.cu_seqlens_k == p.cu_seqlens_q &&
         reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && ceil_div(g.max_seqlen_q, 128) <= 65535 &&
         flash_fwd_sm90_available(p.head_dim);
}

void run_flash_fwd_sm90(const Params& p, const Grid& g, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch<64>(p, g, stream);
  else
    launch<128>(p, g, stream);
}

}  // namespace engine::cuda::flash
