// Launchers of flash attention (flash.cuh): the checks of their own limits (the shared ones ran in
// ops/attention.cpp), the kernel parameters (q, k and their strides from qkv, or k from a separate
// kv), the choice between the Hopper and the mma.sync kernels (D = 64, 128;
// AttentionParams::kernel) and the f32 fallback, and the two small kernels around the backward:
//   dsum_kernel:       dsum[t, h] = sum_d dout[t, h, d] * out[t, h, d]   (f32, 8 lanes per row)
//                      and, on the mma path, dq_accum row (h, t) = 0 (it touches every row)
//   dq_convert_kernel: dqkv[t, h, :] = bf16(scale * dq_accum row (h, t))  for the q heads
// dq_accum is (H, T, D) f32 in the layout of dq_accum_index (flash_layout.h: head-major, 16-byte
// chunks swizzled by token). Backward on the mma path: dsum (+ zeroing), flash_bwd_kernel
// (writes dK, dV and adds into dq_accum), dq_convert. Everything runs in order on the compute
// stream; the scratch buffers go back to the caching allocator on return, which is safe
// because every later user of that memory is ordered behind these kernels on the same stream.
#include "cuda/attention/flash.cuh"

#include <limits>

#include "core/buffer.h"
#include "cuda/attention/flash_common.cuh"
#include "cuda/common/launch.cuh"

namespace engine::cuda {
namespace {

using flash::bf16;

constexpr int kRowsPerBlock = 32;  // dsum: 8 lanes per (token, head) row, 256 threads

// dq_accum: zeroed here when not null (the mma path: D % 4 == 0, 16-byte aligned rows).
template <bool kVec>
__global__ void __launch_bounds__(256) dsum_kernel(const bf16* __restrict__ out,
                                                   const bf16* __restrict__ dout,
                                                   float* __restrict__ dsum, int64_t rows,
                                                   int D, float* __restrict__ dq_accum,
                                                   int64_t T, int H) {
  wait_for_previous_kernel();
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 8;
  const int sub = threadIdx.x % 8;
  float acc = 0.f;
  if (r < rows) {
    const bf16* o = out + r * D;
    const bf16* g = dout + r * D;
    if constexpr (kVec) {  // D % 8 == 0, rows 16-byte aligned
      for (int ch = sub; ch < D / 8; ch += 8) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + ch * 8);
        const uint4 gv = *reinterpret_cast<const uint4*>(g + ch * 8);
        const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
        const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 a = __bfloat1622float2(o2[k]), b = __bfloat1622float2(g2[k]);
          acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
        }
      }
    } else {
      for (int d = sub; d < D; d += 8)
        acc = fmaf(__bfloat162float(o[d]), __bfloat162float(g[d]), acc);
    }
    if (dq_accum != nullptr) {  // row (h, t) of the (H, T, D) accumulator; r = t H + h
      const int64_t t = r / H;
      const int h = static_cast<int>(r - t * H);
      float4* z = reinterpret_cast<float4*>(dq_accum + (h * T + t) * D);
      for (int ch = sub; ch < D / 4; ch += 8) z[ch] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (r < rows && sub == 0) dsum[r] = acc;
}

// One 16-byte chunk (4 f32) of dq_accum per thread, head blockIdx.y; the chunk's place in the
// row is swizzled by the token (flash::dq_row_offset: an involution on the chunk index), its
// columns in dqkv are not.
template <int kD>
__global__ void __launch_bounds__(256)
    dq_convert_kernel(const float* __restrict__ dq_accum, bf16* __restrict__ dq, int64_t T,
                      int64_t q_row, float scale) {
  wait_for_previous_kernel();
  constexpr int kChunks = kD / 4;
  const int h = blockIdx.y;
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;  // t * kChunks + chunk
  if (e >= T * kChunks) return;
  const int64_t t = e / kChunks;
  const int d = 4 * (static_cast<int>(e % kChunks) ^ flash::dq_swizzle(t));  // its columns
  const float4 v = *reinterpret_cast<const float4*>(dq_accum + int64_t{h} * T * kD + 4 * e);
  uint2 packed;
  packed.x = flash::pack_bf16(v.x * scale, v.y * scale);
  packed.y = flash::pack_bf16(v.z * scale, v.w * scale);
  *reinterpret_cast<uint2*>(dq + t * q_row + int64_t{h} * kD + d) = packed;
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

// The kernel parameters (backward fields left empty) and the grid sizes of one call.
struct Launch {
  flash::Params k;
  flash::Grid g;
};

// Checks what the flash kernels add to the shared checks (ops/attention.cpp: shapes, the dtype
// relations, scalar ranges) and fills the launch: qkv in bf16 (so out, kv in bf16, lse in f32),
// head dims up to the fallback's, the grid's and the i32 offsets' limits, 16-byte alignment for
// the mma path.
Launch make_params(const ops::AttentionParams& p, const char* op) {
  ENSURE(p.head_dim <= flash::kFallbackMaxHeadDim, op, ": head_dim = ", p.head_dim,
         " (supported: 1 .. ", flash::kFallbackMaxHeadDim, ")");
  ENSURE(p.qkv.dtype == DType::BF16, op, ": qkv (T, H + 2*Hkv, D) has dtype ",
         dtype_name(p.qkv.dtype), ", expected ", dtype_name(DType::BF16));
  const int64_t t = p.qkv.size(0), h = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim;
  ENSURE(p.max_seqlen <= std::numeric_limits<int>::max() / 2, op, ": max_seqlen = ",
         p.max_seqlen);
  const int64_t seqs = p.cu_seqlens.size(0) - 1;
  ENSURE(seqs <= 65535 && h <= 65535, op, ": ", seqs, " sequences and ", h,
         " heads; the grid allows 65535 of each");
  ENSURE(t <= std::numeric_limits<int32_t>::max(), op, ": T = ", t,
         " tokens; cu_seqlens (i32) cannot address them");
  const bool mma = flash::has_mma_path(p.head_dim);
  if (mma)
    ENSURE(aligned16(p.qkv) && aligned16(p.out), op,
           ": qkv and out must be 16-byte aligned for head_dim ", p.head_dim);
  flash::Params k{};
  flash::Grid g{};
  const bf16* qkv = static_cast<const bf16*>(p.qkv.data);
  k.q = qkv;
  k.out = static_cast<bf16*>(p.out.data);
  k.lse = static_cast<float*>(p.lse.data);
  k.cu_seqlens_q = static_cast<const int32_t*>(p.cu_seqlens.data);
  k.q_row = static_cast<int>((h + 2 * hkv) * d);
  if (p.separate_kv()) {  // keys and values from kv (cu_seqlens_k is never read on the host)
    const int64_t tk = p.kv.size(0);
    ENSURE(p.max_seqlen_k <= std::numeric_limits<int>::max() / 2, op, ": max_seqlen_k = ",
           p.max_seqlen_k);
    ENSURE(tk <= std::numeric_limits<int32_t>::max(), op, ": Tk = ", tk,
           " key rows; cu_seqlens_k (i32) cannot address them");
    if (mma) ENSURE(aligned16(p.kv), op, ": kv must be 16-byte aligned for head_dim ", p.head_dim);
    k.k = static_cast<const bf16*>(p.kv.data);
    k.kv_row = static_cast<int>(2 * hkv * d);
    k.cu_seqlens_k = static_cast<const int32_t*>(p.cu_seqlens_k.data);
    g.max_seqlen_k = p.max_seqlen_k;
  } else {
    k.k = qkv + h * d;
    k.kv_row = k.q_row;
    k.cu_seqlens_k = k.cu_seqlens_q;
    g.max_seqlen_k = p.max_seqlen;
  }
  k.num_tokens = static_cast<int>(t);
  k.bwd_section = 1;
  k.num_heads = p.num_heads;
  k.num_kv_heads = p.num_kv_heads;
  k.head_dim = p.head_dim;
  k.scale = p.softmax_scale;
  k.causal = p.causal;
  k.window = p.window;
  g.num_seqs = static_cast<int>(seqs);
  g.max_seqlen_q = p.max_seqlen;
  return {k, g};
}

// No query rows: nothing to compute (the backward still zeroes a separate dkv).
bool nothing_to_do(const Launch& l, const ops::AttentionParams& p) {
  return p.qkv.size(0) == 0 || l.g.num_seqs == 0 || l.g.max_seqlen_q == 0;
}

}  // namespace

bool attention_sm90_available(int head_dim) { return flash::flash_fwd_sm90_available(head_dim); }

const char* attention_kernel_for(int head_dim, ops::AttentionKernel kernel) {
  if (head_dim <= 0 || head_dim > flash::kFallbackMaxHeadDim) return "unsupported";
  if (!flash::has_mma_path(head_dim)) return "fallback";
  if (kernel == ops::AttentionKernel::MmaSync) return "mma.sync";
  const bool fwd = flash::flash_fwd_sm90_available(head_dim);
  const bool bwd = flash::flash_bwd_sm90_available(head_dim);
  if (fwd && bwd) return "sm90";
  if (fwd) return "sm90 forward, mma.sync backward";
  if (bwd) return "mma.sync forward, sm90 backward";
  return "mma.sync";
}

void flash_attention_forward(const ops::AttentionParams& p) {
  const Launch l = make_params(p, "attention_forward");
  if (nothing_to_do(l, p)) return;
  if (p.kernel != ops::AttentionKernel::MmaSync && flash::flash_fwd_sm90_eligible(l.k, l.g))
    flash::run_flash_fwd_sm90(l.k, l.g, stream());
  else if (flash::has_mma_path(l.k.head_dim))
    flash::head_dim_switch(l.k.head_dim, [&](auto d) {
      flash::run_flash_fwd<decltype(d)::value>(l.k, l.g, stream());
    });
  else
    flash::run_fallback_fwd(l.k, l.g, stream());
}

void flash_attention_backward(const ops::AttentionBackwardParams& bp) {
  const char* op = "attention_backward";
  Launch l = make_params(bp.fwd, op);
  flash::Params& k = l.k;
  const int64_t t = bp.fwd.qkv.size(0), h = k.num_heads, d = k.head_dim;
  const bool mma = flash::has_mma_path(k.head_dim);
  if (mma)
    ENSURE(aligned16(bp.dout) && aligned16(bp.dqkv), op,
           ": dout and dqkv must be 16-byte aligned for head_dim ", k.head_dim);
  const bool separate = bp.fwd.separate_kv();
  if (separate && mma)
    ENSURE(aligned16(bp.dkv), op, ": dkv must be 16-byte aligned for head_dim ", k.head_dim);
  if (nothing_to_do(l, bp.fwd)) {  // no query sees any key
    if (separate && bp.dkv.nbytes() > 0)
      CUDA_CHECK(cudaMemsetAsync(bp.dkv.data, 0, bp.dkv.nbytes(), stream()));
    return;
  }
  k.dout = static_cast<const bf16*>(bp.dout.data);
  bf16* dqkv = static_cast<bf16*>(bp.dqkv.data);
  k.dq = dqkv;
  k.dk = separate ? static_cast<bf16*>(bp.dkv.data) : dqkv + h * d;

  const int64_t rows = t * h;
  Buffer dsum(static_cast<size_t>(rows) * sizeof(float), Device::CUDA);
  k.dsum = static_cast<float*>(dsum.data());
  Buffer dq_accum(mma ? static_cast<size_t>(rows * d) * sizeof(float) : 0, Device::CUDA);
  k.dq_accum = static_cast<float*>(dq_accum.data());  // null on the fallback path
  const bool vec = d % 8 == 0 && aligned16(bp.dout) && aligned16(bp.fwd.out);
  const unsigned dsum_blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  if (vec)
    launch_dependent(dsum_kernel<true>, dsum_blocks, 256, 0, k.out, k.dout, k.dsum, rows,
                     k.head_dim, k.dq_accum, t, k.num_heads);
  else
    launch_dependent(dsum_kernel<false>, dsum_blocks, 256, 0, k.out, k.dout, k.dsum, rows,
                     k.head_dim, k.dq_accum, t, k.num_heads);
  check_launch("dsum_kernel");

  if (!mma) {
    flash::run_fallback_bwd(k, l.g, stream());
    return;
  }
  flash::head_dim_switch(k.head_dim, [&](auto dim) {
    constexpr int kD = decltype(dim)::value;
    if (bp.fwd.kernel != ops::AttentionKernel::MmaSync && flash::flash_bwd_sm90_eligible(k, l.g))
      flash::run_flash_bwd_sm90(k, l.g, stream());
    else
      flash::run_flash_bwd<kD>(k, l.g, stream());
    const dim3 grid(static_cast<unsigned>(ceil_div(t * (kD / 4), 256)),
                    static_cast<unsigned>(k.num_heads));
    launch_dependent(dq_convert_kernel<kD>, grid, 256, 0, k.dq_accum, k.dq, t, k.q_row, k.scale);
  });
  check_launch("dq_convert_kernel");
}

}  // namespace engine::cuda
