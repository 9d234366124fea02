// cuDNN fused attention (cudnn_sdpa.cuh): the checks of its own limits (the shared ones ran in
// ops/attention.cpp), the operation graphs of the forward and the backward (built with
// cudnn_graph.cuh's Graph on the backend API), the plan cache, and the small kernels around them:
//   seq_info_kernel:  per (bucketed) sequence b its query and key lengths (0 past the real ones)
//                     and the ragged offsets (first row x row stride, in elements) of the q-side,
//                     out-side and key-side tensors
//   stats_kernel:     the (B, H, Sq) f32 softmax statistics <-> lse (T, H)
// Tensor names follow cuDNN's [batch, head, seq, dim] order with explicit strides over the
// packed rows: q (and dq) in qkv's rows of (H + 2 Hkv) D elements, k and v in qkv's or kv's rows,
// out and dout in rows of H D. Everything runs on the compute stream; scratch buffers go back to
// the caching allocator on return (later users are ordered behind on the same stream).
#include "cuda/attention/cudnn_sdpa.cuh"

#include "core/check.h"

#ifndef ENGINE_CUDNN

namespace engine::cuda {

namespace {
[[noreturn]] void no_cudnn() {
  RAISE("model.attention_backend = \"cudnn\": this binary was built without cuDNN (ENGINE_CUDNN is not "
        "defined; the Makefile found no cudnn.h / libcudnn.so.9): use \"flash\"");
}
}  // namespace

void cudnn_attention_forward(const ops::AttentionParams&) { no_cudnn(); }
void cudnn_attention_backward(const ops::AttentionBackwardParams&) { no_cudnn(); }
bool cudnn_built() { return false; }
std::string cudnn_version() { return ""; }
int cudnn_attention_plans_built() { return 0; }

}  // namespace engine::cuda

#else  // ENGINE_CUDNN

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/buffer.h"
#include "core/log.h"
#include "cuda/attention/cudnn_graph.cuh"
#include "cuda/attention/flash.cuh"
#include "cuda/common/launch.cuh"

namespace engine::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cudnn::check;
using cudnn::Descriptor;
using cudnn::Dims;
using cudnn::Graph;
using cudnn::handle;
using cudnn::version_string;

// ---------------------------------------------------------------------------------------------
// Kernels.

struct SeqInfo {
  const int32_t* cu_q;  // (S + 1)
  const int32_t* cu_k;  // (S + 1), cu_q without separate keys
  int num_seqs, batch;  // S real sequences, batch >= S bucketed
  int64_t q_row, o_row, k_row;  // row strides (elements) of the q-side, out-side, key-side tensors
  int32_t *seq_q, *seq_k;        // (batch)
  int32_t *off_q, *off_o, *off_k;  // (batch + 1)
};

__global__ void seq_info_kernel(SeqInfo a) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b <= a.batch; b += blockDim.x * gridDim.x) {
    const int s = min(b, a.num_seqs);
    const int32_t q0 = a.cu_q[s], k0 = a.cu_k[s];
    a.off_q[b] = static_cast<int32_t>(q0 * a.q_row);
    a.off_o[b] = static_cast<int32_t>(q0 * a.o_row);
    a.off_k[b] = static_cast<int32_t>(k0 * a.k_row);
    if (b < a.batch) {
      const bool real = b < a.num_seqs;
      a.seq_q[b] = real ? a.cu_q[b + 1] - q0 : 0;
      a.seq_k[b] = real ? a.cu_k[b + 1] - k0 : 0;
    }
  }
}

// dense (batch, H, Sq) f32 <-> lse (T, H); blockIdx.y is the sequence.
template <bool kToLse>
__global__ void stats_kernel(float* __restrict__ dense, float* __restrict__ lse,
                             const int32_t* __restrict__ cu, int H, int Sq) {
  const int b = blockIdx.y;
  const int32_t start = cu[b], len = cu[b + 1] - start;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < int64_t{len} * H;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t s = i / H;
    if (s >= Sq) break;  // a sequence longer than max_seqlen (a caller's error): stay in its slice
    const int h = static_cast<int>(i - s * H);
    float* d = dense + (int64_t{b} * H + h) * Sq + s;
    float* l = lse + (start + s) * H + h;
    if constexpr (kToLse)
      *l = *d;
    else
      *d = *l;
  }
}

// ---------------------------------------------------------------------------------------------
// Fixed ids of the tensors the caller binds at execution (virtual tensors and by-value constants
// get ids from cudnn::kFirstFreeUid on).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqK, kOffQ, kOffO, kOffK,
  kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum
};
static_assert(kDQAccum < cudnn::kFirstFreeUid);
// ---------------------------------------------------------------------------------------------
// The shapes of one call and the graphs built from them.

struct Shape4 {
  bool backward = false;
  int batch = 0, s_q = 0, s_k = 0;  // bucketed
  int heads = 0, kv_heads = 0, dim = 0;
  int64_t q_row = 0, k_row = 0, o_row = 0;  // row strides in elements
  bool causal = true, separate = false;
  int window = 0;
  uint32_t scale_bits = 0;
  int device = 0;
  auto tie() const {
    return std::tie(backward, batch, s_q, s_k, heads, kv_heads, dim, q_row, k_row, o_row, causal, separate,
                    window, scale_bits, device);
  }
  bool operator<(const Shape4& o) const { return tie() < o.tie(); }
  std::string str() const {
    return str_cat(backward ? "backward" : "forward", " graph for B ", batch, " (bucketed) x H ", heads, " / Hkv ",
                   kv_heads, ", s_q ", s_q, ", s_kv ", s_k, ", D ", dim, causal ? ", causal" : "",
                   window ? str_cat(", window ", window) : std::string(), separate ? ", separate kv" : "");
  }
};

// The tensors both graphs share.
struct Common {
  Descriptor seq_q, seq_k, off_q, off_o, off_k, scale;
  Dims s_dims, s_strides, row_dims, row_strides;
};

Common common_tensors(Graph& g, const Shape4& k) {
  Common c;
  const int64_t B = k.batch, H = k.heads, Sq = k.s_q, Sk = k.s_k;
  c.seq_q = g.tensor(CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1}, kSeqQ);
  c.seq_k = g.tensor(CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1}, kSeqK);
  c.off_q = g.tensor(CUDNN_DATA_INT32, {B + 1, 1, 1, 1}, {1, 1, 1, 1}, kOffQ);
  c.off_o = g.tensor(CUDNN_DATA_INT32, {B + 1, 1, 1, 1}, {1, 1, 1, 1}, kOffO);
  c.off_k = g.tensor(CUDNN_DATA_INT32, {B + 1, 1, 1, 1}, {1, 1, 1, 1}, kOffK);
  float scale;
  std::memcpy(&scale, &k.scale_bits, sizeof scale);
  c.scale = g.constant(scale, CUDNN_DATA_FLOAT);
  c.s_dims = {B, H, Sq, Sk};
  c.s_strides = {H * Sq * Sk, Sq * Sk, Sk, 1};
  c.row_dims = {B, H, Sq, 1};
  c.row_strides = {H * Sq, Sq, 1, 1};
  return c;
}

// The masks on the scaled scores x (padding, then causal, then the window), as cuDNN's fused
// engines expect them: keep (row < len_q && col < len_k); causal keep row + off >= col with
// off = len_k - len_q (bottom-right alignment, separate keys) or 0; window keep
// col + window - off > row.
Descriptor masks(Graph& g, const Shape4& k, const Common& c, Descriptor x) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto index = [&](Descriptor score, int64_t axis, cudnnDataType_t compute) {
    Descriptor i = g.virt(CUDNN_DATA_INT32, c.s_dims, c.s_strides);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, score, nullptr, nullptr, i, compute, axis);
    return i;
  };
  auto binary = [&](cudnnPointwiseMode_t mode, Descriptor a, Descriptor b, cudnnDataType_t out,
                    cudnnDataType_t compute, int64_t axis = -1) {
    Descriptor y = g.virt(out, c.s_dims, c.s_strides);
    g.pointwise(mode, a, b, nullptr, y, compute, axis);
    return y;
  };
  auto select = [&](Descriptor score, Descriptor keep) {
    Descriptor y = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, score, g.constant(neg_inf, CUDNN_DATA_FLOAT), keep, y);
    return y;
  };
  {  // padding
    Descriptor row = index(x, 2, CUDNN_DATA_INT32), col = index(x, 3, CUDNN_DATA_INT32);
    Descriptor row_ok = binary(CUDNN_POINTWISE_CMP_LT, row, c.seq_q, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    Descriptor col_ok = binary(CUDNN_POINTWISE_CMP_LT, col, c.seq_k, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    Descriptor keep =
        binary(CUDNN_POINTWISE_LOGICAL_AND, row_ok, col_ok, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    x = select(x, keep);
  }
  if (k.causal) {  // right bound 0
    Descriptor row = index(x, 2, CUDNN_DATA_FLOAT), col = index(x, 3, CUDNN_DATA_FLOAT);
    if (k.separate) {
      row = binary(CUDNN_POINTWISE_ADD, row, c.seq_k, CUDNN_DATA_INT32, CUDNN_DATA_INT32, 3);
      row = binary(CUDNN_POINTWISE_SUB, row, c.seq_q, CUDNN_DATA_INT32, CUDNN_DATA_INT32, 3);
    }
    x = select(x, binary(CUDNN_POINTWISE_CMP_GE, row, col, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN));
  }
  if (k.window > 0) {  // left bound
    Descriptor row = index(x, 2, CUDNN_DATA_FLOAT), col = index(x, 3, CUDNN_DATA_FLOAT);
    if (k.separate) {
      col = binary(CUDNN_POINTWISE_ADD, col, g.constant(int32_t{k.window}, CUDNN_DATA_INT32), CUDNN_DATA_INT32,
                   CUDNN_DATA_INT32, 3);
      col = binary(CUDNN_POINTWISE_SUB, col, c.seq_k, CUDNN_DATA_INT32, CUDNN_DATA_INT32, 3);
      col = binary(CUDNN_POINTWISE_ADD, col, c.seq_q, CUDNN_DATA_INT32, CUDNN_DATA_INT32, 3);
    } else {
      col = binary(CUDNN_POINTWISE_ADD, col, g.constant(static_cast<float>(k.window), CUDNN_DATA_FLOAT),
                   CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, 3);
    }
    x = select(x, binary(CUDNN_POINTWISE_CMP_GT, col, row, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN));
  }
  return x;
}

// q, k^T, v (or v^T) and out-side tensors over the packed rows.
struct Io {
  Descriptor q, kt, v, o;
};

Io io_tensors(Graph& g, const Shape4& k, const Common& c, bool v_transposed) {
  const int64_t B = k.batch, H = k.heads, Hk = k.kv_heads, D = k.dim, Sq = k.s_q, Sk = k.s_k;
  Io io;
  io.q = g.tensor(CUDNN_DATA_BFLOAT16, {B, H, Sq, D}, {Sq * k.q_row, D, k.q_row, 1}, kQ, c.off_q);
  io.kt = g.tensor(CUDNN_DATA_BFLOAT16, {B, Hk, D, Sk}, {Sk * k.k_row, D, 1, k.k_row}, kK, c.off_k);
  if (v_transposed)
    io.v = g.tensor(CUDNN_DATA_BFLOAT16, {B, Hk, D, Sk}, {Sk * k.k_row, D, 1, k.k_row}, kV, c.off_k);
  else
    io.v = g.tensor(CUDNN_DATA_BFLOAT16, {B, Hk, Sk, D}, {Sk * k.k_row, D, k.k_row, 1}, kV, c.off_k);
  io.o = g.tensor(CUDNN_DATA_BFLOAT16, {B, H, Sq, D}, {Sq * k.o_row, D, k.o_row, 1}, kO, c.off_o);
  return io;
}

void build_forward(Graph& g, const Shape4& k) {
  const Common c = common_tensors(g, k);
  const Io io = io_tensors(g, k, c, false);
  Descriptor stats = g.tensor(CUDNN_DATA_FLOAT, c.row_dims, c.row_strides, kStats);
  Descriptor s = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.matmul(io.q, io.kt, s, c.seq_q, c.seq_k, nullptr);
  Descriptor scaled = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, s, c.scale, nullptr, scaled);
  const Descriptor masked = masks(g, k, c, scaled);
  // softmax: stats = max + log(sum exp(x - max)), p = exp(x - max) / sum
  Descriptor max = g.virt(CUDNN_DATA_FLOAT, c.row_dims, c.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  Descriptor shifted = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, max, nullptr, shifted);
  Descriptor e = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
  Descriptor sum = g.virt(CUDNN_DATA_FLOAT, c.row_dims, c.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  Descriptor log_sum = g.virt(CUDNN_DATA_FLOAT, c.row_dims, c.row_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats);
  Descriptor p = g.virt(CUDNN_DATA_BFLOAT16, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, nullptr, p);
  g.matmul(p, io.v, io.o, c.seq_q, nullptr, c.seq_k);
}

void build_backward(Graph& g, const Shape4& k) {
  const int64_t B = k.batch, H = k.heads, Hk = k.kv_heads, D = k.dim, Sq = k.s_q, Sk = k.s_k;
  const Common c = common_tensors(g, k);
  const Io io = io_tensors(g, k, c, true);  // io.v is v^T
  Descriptor stats = g.tensor(CUDNN_DATA_FLOAT, c.row_dims, c.row_strides, kStats);
  Descriptor dout = g.tensor(CUDNN_DATA_BFLOAT16, {B, H, Sq, D}, {Sq * k.o_row, D, k.o_row, 1}, kDO, c.off_o);
  Descriptor dq = g.tensor(CUDNN_DATA_BFLOAT16, {B, H, Sq, D}, {Sq * k.q_row, D, k.q_row, 1}, kDQ, c.off_q);
  Descriptor dk = g.tensor(CUDNN_DATA_BFLOAT16, {B, Hk, Sk, D}, {Sk * k.k_row, D, k.k_row, 1}, kDK, c.off_k);
  Descriptor dv = g.tensor(CUDNN_DATA_BFLOAT16, {B, Hk, Sk, D}, {Sk * k.k_row, D, k.k_row, 1}, kDV, c.off_k);
  const Dims st_dims = {B, H, Sk, Sq}, st_strides = {H * Sq * Sk, Sq * Sk, 1, Sk};  // transposed scores

  // softmax_sum = sum_d dout * out (f32 in the workspace)
  Descriptor prod = g.virt(CUDNN_DATA_FLOAT, {B, H, Sq, D}, {H * Sq * D, Sq * D, H * D, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, io.o, nullptr, prod);
  Descriptor rowsum = g.virt(CUDNN_DATA_FLOAT, c.row_dims, c.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
  Descriptor softmax_sum = g.tensor(CUDNN_DATA_FLOAT, c.row_dims, c.row_strides, kSoftmaxSum);
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum, g.constant(1.f, CUDNN_DATA_FLOAT), nullptr, softmax_sum);

  // p = exp(scale q k^T - stats), masked
  Descriptor s = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.matmul(io.q, io.kt, s, c.seq_q, c.seq_k, nullptr);
  Descriptor scaled = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, s, c.scale, nullptr, scaled);
  Descriptor centred = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, centred);
  const Descriptor masked = masks(g, k, c, centred);
  Descriptor p = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, p);

  // dv = p^T dout (summed over the query heads of a group)
  Descriptor pt = g.virt(CUDNN_DATA_BFLOAT16, st_dims, st_strides);
  g.reshape(p, pt);
  if (H == Hk) {
    g.matmul(pt, dout, dv, c.seq_k, nullptr, c.seq_q);
  } else {
    Descriptor full = g.virt(CUDNN_DATA_BFLOAT16, {B, H, Sk, D}, {H * Sk * D, Sk * D, D, 1});
    g.matmul(pt, dout, full, c.seq_k, nullptr, c.seq_q);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, dv);
  }

  // ds = scale * p * (dout v^T - softmax_sum)
  Descriptor dp = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.matmul(dout, io.v, dp, c.seq_q, c.seq_k, nullptr);
  Descriptor dp_centred = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, dp_centred);
  Descriptor ds_unscaled = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centred, p, nullptr, ds_unscaled);
  Descriptor ds = g.virt(CUDNN_DATA_FLOAT, c.s_dims, c.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, c.scale, nullptr, ds);

  // dk = ds^T q (summed over the group)
  Descriptor dst = g.virt(CUDNN_DATA_BFLOAT16, st_dims, st_strides);
  g.reshape(ds, dst);
  if (H == Hk) {
    g.matmul(dst, io.q, dk, c.seq_k, nullptr, c.seq_q);
  } else {
    Descriptor full = g.virt(CUDNN_DATA_BFLOAT16, {B, H, Sk, D}, {H * Sk * D, Sk * D, D, 1});
    g.matmul(dst, io.q, full, c.seq_k, nullptr, c.seq_q);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, dk);
  }

  // dq = ds k through an f32 accumulator in the workspace
  Descriptor kr = g.virt(CUDNN_DATA_BFLOAT16, {B, Hk, Sk, D}, {Sk * k.k_row, D, k.k_row, 1}, c.off_k);
  g.reshape(io.kt, kr);
  Descriptor dq_accum = g.tensor(CUDNN_DATA_FLOAT, {B, H, Sq, D}, {H * Sq * D, Sq * D, D, 1}, kDQAccum);
  g.matmul(ds, kr, dq_accum, c.seq_q, nullptr, c.seq_k);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, dq);
}

std::mutex g_plans_mutex;
std::map<Shape4, std::unique_ptr<Graph>> g_plans;
int g_plans_built = 0;

Graph& plan_for(const Shape4& k, cudnnHandle_t h) {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  std::unique_ptr<Graph>& slot = g_plans[k];
  if (!slot) {
    auto g = std::make_unique<Graph>(str_cat(k.str(), ", cuDNN ", version_string()));
    if (k.backward)
      build_backward(*g, k);
    else
      build_forward(*g, k);
    g->build(h);
    slot = std::move(g);
    ++g_plans_built;
  }
  return *slot;
}

// ---------------------------------------------------------------------------------------------
// Calls.

int bucket(int64_t n, int least) {
  int64_t b = least;
  while (b < n) b *= 2;
  return static_cast<int>(b);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void expect_aligned(const Tensor& t, const char* op, const char* name) {
  ENSURE(aligned16(t.data), op, ": ", name,
         " must be 16-byte aligned for cuDNN (model.attention_backend = \"cudnn\")");
}

// One call's checked arguments, key and device-side sequence tables.
struct Call {
  Shape4 key;
  int num_seqs = 0;
  int64_t t = 0, tk = 0;
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;
  Buffer tables;  // seq_q, seq_k (batch each), off_q, off_o, off_k (batch + 1 each), i32
  // Each table starts 16 bytes aligned, as the tensors' declared alignment says.
  static int64_t table_stride(int64_t batch) { return (batch + 1 + 3) / 4 * 4; }
  int32_t* table(int i) const { return static_cast<int32_t*>(tables.data()) + i * table_stride(key.batch); }
  bool empty() const { return t == 0 || num_seqs == 0; }
};

// The checks cuDNN adds to the shared ones (ops/attention.cpp: shapes, the dtype relations, scalar
// ranges): bf16 (so out, kv in bf16, lse in f32), head dims, 16-byte alignment, its bounds on the
// sequence lengths and the i32 ragged offsets.
Call prepare(const ops::AttentionParams& p, bool backward, const char* op) {
  ENSURE(p.head_dim > 0 && p.head_dim % 8 == 0 && p.head_dim <= 256, op, ": head_dim = ", p.head_dim,
         "; cuDNN's fused attention takes multiples of 8 up to 256 (model.attention_backend = \"flash\" "
         "runs any)");
  const int64_t t = p.qkv.size(0), h = p.num_heads, hkv = p.num_kv_heads, d = p.head_dim;
  ENSURE(p.qkv.dtype == DType::BF16, op, ": cuDNN attention runs bf16 only, qkv is ", dtype_name(p.qkv.dtype));
  expect_aligned(p.qkv, op, "qkv (T, H + 2*Hkv, D)");
  expect_aligned(p.out, op, "out (T, H, D)");
  expect_aligned(p.lse, op, "lse (T, H)");
  ENSURE(p.max_seqlen <= (1 << 24), op, ": max_seqlen = ", p.max_seqlen);
  Call c;
  c.num_seqs = static_cast<int>(p.cu_seqlens.size(0) - 1);
  c.t = t;
  const int64_t q_row = (h + 2 * hkv) * d;
  const bf16* qkv = static_cast<const bf16*>(p.qkv.data);
  c.q = qkv;
  c.cu_q = static_cast<const int32_t*>(p.cu_seqlens.data);
  Shape4& k = c.key;
  k.backward = backward;
  k.heads = static_cast<int>(h);
  k.kv_heads = static_cast<int>(hkv);
  k.dim = static_cast<int>(d);
  k.q_row = q_row;
  k.o_row = h * d;
  k.causal = p.causal;
  k.window = p.window;
  std::memcpy(&k.scale_bits, &p.softmax_scale, sizeof k.scale_bits);
  CUDA_CHECK(cudaGetDevice(&k.device));
  int max_k = p.max_seqlen;
  if (p.separate_kv()) {
    c.tk = p.kv.size(0);
    expect_aligned(p.kv, op, "kv (Tk, 2*Hkv, D)");
    ENSURE(p.max_seqlen_k <= (1 << 24), op, ": max_seqlen_k = ", p.max_seqlen_k);
    k.separate = true;
    k.k_row = 2 * hkv * d;
    c.k = static_cast<const bf16*>(p.kv.data);
    c.v = c.k + hkv * d;
    c.cu_k = static_cast<const int32_t*>(p.cu_seqlens_k.data);
    max_k = p.max_seqlen_k;
  } else {
    c.tk = t;
    k.k_row = q_row;
    c.k = qkv + h * d;
    c.v = qkv + (h + hkv) * d;
    c.cu_k = c.cu_q;
  }
  // The ragged offsets are i32 element offsets.
  ENSURE(t * q_row <= std::numeric_limits<int32_t>::max() && c.tk * k.k_row <= std::numeric_limits<int32_t>::max(),
         op, ": ", t, " rows of ", q_row, " elements are past cuDNN's i32 ragged offsets");
  if (c.empty()) return c;
  k.batch = bucket(c.num_seqs, 1);
  k.s_q = bucket(p.max_seqlen, 64);
  k.s_k = k.separate ? bucket(std::max(max_k, 1), 64) : k.s_q;
  c.tables = Buffer(static_cast<size_t>(5 * Call::table_stride(k.batch)) * sizeof(int32_t), Device::CUDA);
  SeqInfo a{c.cu_q, c.cu_k, c.num_seqs, k.batch, k.q_row, k.o_row, k.k_row,
            c.table(0), c.table(1), c.table(2), c.table(3), c.table(4)};
  seq_info_kernel<<<static_cast<unsigned>(ceil_div(k.batch + 1, 256)), 256, 0, stream()>>>(a);
  check_launch("seq_info_kernel");
  return c;
}

std::vector<std::pair<int64_t, void*>> bind_common(const Call& c, const Tensor& out, void* stats) {
  auto mut = [](const void* p) { return const_cast<void*>(p); };
  return {{kQ, mut(c.q)},         {kK, mut(c.k)},         {kV, mut(c.v)},          {kO, out.data},
          {kStats, stats},        {kSeqQ, c.table(0)},    {kSeqK, c.table(1)},     {kOffQ, c.table(2)},
          {kOffO, c.table(3)},    {kOffK, c.table(4)}};
}

void stats_copy(bool to_lse, float* dense, const Tensor& lse, const Call& c) {
  const int H = c.key.heads, Sq = c.key.s_q;
  const int64_t per_seq = std::min<int64_t>(int64_t{Sq} * H, 1 << 20);
  const dim3 grid(static_cast<unsigned>(ceil_div(per_seq, 256)), static_cast<unsigned>(c.num_seqs));
  ENSURE(c.num_seqs <= 65535, "cuDNN attention: ", c.num_seqs, " sequences; the statistics copy allows 65535");
  if (to_lse)
    stats_kernel<true><<<grid, 256, 0, stream()>>>(dense, static_cast<float*>(lse.data), c.cu_q, H, Sq);
  else
    stats_kernel<false><<<grid, 256, 0, stream()>>>(dense, static_cast<float*>(lse.data), c.cu_q, H, Sq);
  check_launch("stats_kernel");
}

size_t round_up(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

bool cudnn_built() { return true; }
std::string cudnn_version() { return version_string(); }
int cudnn_attention_plans_built() {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  return g_plans_built;
}

void cudnn_attention_forward(const ops::AttentionParams& p) {
  const Call c = prepare(p, false, "attention_forward (cudnn)");
  if (c.empty()) return;
  const cudnnHandle_t h = handle();
  Graph& g = plan_for(c.key, h);
  const size_t stats_bytes = static_cast<size_t>(c.key.batch) * c.key.heads * c.key.s_q * sizeof(float);
  Buffer scratch(round_up(stats_bytes) + static_cast<size_t>(g.workspace()), Device::CUDA);
  float* stats = static_cast<float*>(scratch.data());
  void* workspace = static_cast<char*>(scratch.data()) + round_up(stats_bytes);
  g.execute(h, bind_common(c, p.out, stats), workspace);
  stats_copy(true, stats, p.lse, c);
}

void cudnn_attention_backward(const ops::AttentionBackwardParams& bp) {
  const char* op = "attention_backward (cudnn)";
  const ops::AttentionParams& p = bp.fwd;
  const Call c = prepare(p, true, op);
  const int64_t t = c.t, h = p.num_heads, d = p.head_dim;
  expect_aligned(bp.dout, op, "dout (T, H, D)");
  expect_aligned(bp.dqkv, op, "dqkv (T, H + 2*Hkv, D)");
  const bool separate = p.separate_kv();
  if (separate) expect_aligned(bp.dkv, op, "dkv (Tk, 2*Hkv, D)");
  // Key rows no query sees (a sequence without queries in this chunk, keys outside every window)
  // may be skipped by cuDNN: their gradients start at zero.
  if (separate && bp.dkv.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(bp.dkv.data, 0, bp.dkv.nbytes(), stream()));
  if (c.empty()) return;
  // (Without separate keys every key row is seen by its own query, window or not.)
  const Shape4& k = c.key;
  const size_t stats_bytes = static_cast<size_t>(k.batch) * k.heads * k.s_q * sizeof(float);
  const size_t accum_bytes = stats_bytes * static_cast<size_t>(k.dim);
  // cuDNN's dQ accumulator is dense over (bucketed batch, heads, bucketed longest sequence, D):
  // many short documents beside one long one make it far larger than the rows themselves (50
  // documents of a 16k-token micro-batch, the longest 4096, at H 16 D 128: 2.1 GB for 134 MB of
  // rows). Past 4x the rows and 256 MiB the flash backward runs instead (it takes either
  // backend's lse), with a warning once.
  const size_t rows_bytes = static_cast<size_t>(t) * static_cast<size_t>(h * d) * sizeof(float);
  if (accum_bytes > 4 * rows_bytes && accum_bytes > (size_t{256} << 20)) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log_warn("model.attention_backend = \"cudnn\": a micro-batch of ", c.num_seqs, " sequences (longest ",
               p.max_seqlen, ") would need a ", format_bytes(static_cast<double>(accum_bytes)),
               " dQ accumulator in cuDNN's backward; the flash backward runs for such micro-batches");
    });
    return flash_attention_backward(bp);
  }
  const cudnnHandle_t hd = handle();
  Graph& g = plan_for(c.key, hd);
  Buffer scratch(2 * round_up(stats_bytes) + round_up(accum_bytes) + static_cast<size_t>(g.workspace()),
                 Device::CUDA);
  char* at = static_cast<char*>(scratch.data());
  float* stats = reinterpret_cast<float*>(at);
  float* softmax_sum = reinterpret_cast<float*>(at + round_up(stats_bytes));
  float* dq_accum = reinterpret_cast<float*>(at + 2 * round_up(stats_bytes));
  void* workspace = at + 2 * round_up(stats_bytes) + round_up(accum_bytes);
  // cuDNN accumulates dQ into it: it starts at zero (memory from the cache holds anything).
  CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, accum_bytes, stream()));
  stats_copy(false, stats, p.lse, c);
  bf16* dqkv = static_cast<bf16*>(bp.dqkv.data);
  bf16* dk = separate ? static_cast<bf16*>(bp.dkv.data) : dqkv + h * d;
  bf16* dv = dk + int64_t{k.kv_heads} * d;
  auto bound = bind_common(c, p.out, stats);
  bound.insert(bound.end(), {{kDO, bp.dout.data},
                             {kDQ, dqkv},
                             {kDK, dk},
                             {kDV, dv},
                             {kSoftmaxSum, softmax_sum},
                             {kDQAccum, dq_accum}});
  g.execute(hd, bound, workspace);
}

}  // namespace engine::cuda

#endif  // ENGINE_CUDNN
