// The attention ops (ops/attention.h): the preconditions both backends share, and the dispatch
// (CPU -> ref/attention.cpp; CUDA -> cuda/attention/attention.cu, which clamps the window and
// picks cuDNN's fused attention or the flash kernels). The backends check what is theirs: the
// dtypes they take, head dims, alignment, grid and 32-bit index limits, and (the reference, which
// can read them) the values of cu_seqlens and cu_seqlens_k.
#include "ops/attention.h"

#include <cmath>

#ifdef ENGINE_CUDA
#include "cuda/attention/flash.cuh"
#endif

namespace engine::ops {
namespace {

// lse: f64 when qkv is f64, else f32.
DType lse_dtype(DType qkv) { return qkv == DType::F64 ? DType::F64 : DType::F32; }

// Defined, of the dtype that qkv's implies, and of this shape.
void expect_as_qkv(const Tensor& t, DType dtype, DType qkv, const Shape& s, const char* op,
                   const char* name) {
  expect_defined(t, op, name);
  ENSURE(t.dtype == dtype, op, ": ", name, " is ", dtype_name(t.dtype), ", expected ",
         dtype_name(dtype), " (qkv is ", dtype_name(qkv), ")");
  expect_shape(t, s, op, name);
}

void check_params(const AttentionParams& p, const char* op) {
  expect_defined(p.qkv, op, "qkv");
  ENSURE(p.qkv.ndim() == 3, op, ": qkv must be (T, H + 2*Hkv, D), got ", p.qkv.shape.str());
  ENSURE(p.num_heads > 0 && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0, op,
         ": num_heads = ", p.num_heads, " must be a positive multiple of num_kv_heads = ",
         p.num_kv_heads);
  ENSURE(p.head_dim > 0, op, ": head_dim = ", p.head_dim);
  const int64_t t = p.qkv.size(0), h = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim;
  const DType dt = p.qkv.dtype;
  expect_shape(p.qkv, {t, h + 2 * hkv, d}, op, "qkv (T, H + 2*Hkv, D)");
  expect_as_qkv(p.out, dt, dt, {t, h, d}, op, "out (T, H, D)");
  expect_as_qkv(p.lse, lse_dtype(dt), dt, {t, h}, op, "lse (T, H)");
  expect_defined(p.cu_seqlens, op, "cu_seqlens");
  ENSURE(p.cu_seqlens.ndim() == 1 && p.cu_seqlens.size(0) >= 1, op,
         ": cu_seqlens must be (S + 1), got shape ", p.cu_seqlens.shape.str());
  expect_dtype(p.cu_seqlens, DType::I32, op, "cu_seqlens");
  ENSURE(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.f, op, ": softmax_scale = ",
         p.softmax_scale, " (usually 1 / sqrt(head_dim))");
  ENSURE(p.window >= 0, op, ": window = ", p.window, " (0 = unlimited)");
  ENSURE(p.max_seqlen >= 0, op, ": max_seqlen = ", p.max_seqlen);
  ENSURE(t == 0 || p.max_seqlen > 0, op, ": max_seqlen = 0 with T = ", t,
         " tokens (it must bound every sequence length)");
  const int64_t seqs = p.cu_seqlens.size(0) - 1;
  if (p.separate_kv()) {
    expect_defined(p.kv, op, "kv");
    ENSURE(p.kv.ndim() == 3, op, ": kv must be (Tk, 2*Hkv, D), got ", p.kv.shape.str());
    const int64_t tk = p.kv.size(0);
    expect_as_qkv(p.kv, dt, dt, {tk, 2 * hkv, d}, op, "kv (Tk, 2*Hkv, D)");
    expect_defined(p.cu_seqlens_k, op, "cu_seqlens_k");
    ENSURE(p.cu_seqlens_k.ndim() == 1 && p.cu_seqlens_k.size(0) == seqs + 1, op,
           ": cu_seqlens_k must be (S + 1) = (", seqs + 1, ") like cu_seqlens, got shape ",
           p.cu_seqlens_k.shape.str());
    expect_dtype(p.cu_seqlens_k, DType::I32, op, "cu_seqlens_k");
    ENSURE(p.max_seqlen_k >= 0, op, ": max_seqlen_k = ", p.max_seqlen_k);
    ENSURE(tk == 0 || p.max_seqlen_k > 0, op, ": max_seqlen_k = 0 with Tk = ", tk,
           " key rows (it must bound every key length)");
  } else {
    ENSURE(p.cu_seqlens_k.data == nullptr && p.cu_seqlens_k.ndim() == 0 && p.max_seqlen_k == 0, op,
           ": cu_seqlens_k and max_seqlen_k are given without kv");
  }
}

void check_attention_forward(const AttentionParams& p) { check_params(p, "attention_forward"); }

void check_attention_backward(const AttentionBackwardParams& p) {
  const char* op = "attention_backward";
  const AttentionParams& f = p.fwd;
  check_params(f, op);
  const int64_t t = f.qkv.size(0), h = f.num_heads, d = f.head_dim;
  const DType dt = f.qkv.dtype;
  expect_as_qkv(p.dout, dt, dt, {t, h, d}, op, "dout (T, H, D)");
  expect_as_qkv(p.dqkv, dt, dt, f.qkv.shape, op, "dqkv (T, H + 2*Hkv, D)");
  if (f.separate_kv())
    expect_as_qkv(p.dkv, dt, dt, f.kv.shape, op, "dkv (Tk, 2*Hkv, D)");
  else
    ENSURE(p.dkv.data == nullptr && p.dkv.ndim() == 0, op, ": dkv is given without fwd.kv");
}

}  // namespace

ENGINE_DEFINE_OPS(ENGINE_ATTENTION_OPS)

const char* attention_kernel_name(Device device, int head_dim, AttentionKernel kernel) {
  if (device == Device::CPU) return "reference";
#ifdef ENGINE_CUDA
  return cuda::attention_kernel_for(head_dim, kernel);
#else
  (void)head_dim;
  (void)kernel;
  no_cuda_build("attention_kernel_name");
#endif
}

}  // namespace engine::ops
