// Multi-head self-attention with grouped-query heads, optional RoPE and sliding window, over
// packed varlen batches (segments from data/varlen.h).
//   qkv = xn [Wq; Wk; Wv]^T (+ b)    one GEMM over the adjacent q, k, v weights (b: bias or qkv_bias)
//   qk_norm (model.qk_norm): RMSNorm of each q head and each k head (weights q_norm, k_norm of
//     head_dim, shared by all heads; ops/qk_norm.h), in place before RoPE
//   rope on the q and k heads (in place, positions restart per document; (T, 2) positions: the
//     2-D RoPE of image patches, ops/rope.h)
//   o = attention(q, k, v)           ops/attention.h (causal, or bidirectional within each sequence
//                                    where ModelConfig::causal is false)
//   y = o Wo^T (+ bo)                bo only with bias
// Saved: qkv after RoPE, o, the log-sum-exp; with qk_norm also the q and k heads before the norm
// and their rstd. xn (the normalised input) is kept by the caller.
// Tensor parallelism (parallel/tensor_parallel.h): each rank holds num_heads / tp query heads and
// num_kv_heads / tp key/value heads (column-parallel qkv), and its columns of Wo (row-parallel);
// with sequence parallelism xn, y, dy and dxn are this rank's token shard and the qkv input is
// gathered (again in backward, instead of being kept). q_norm and k_norm are replicated; each rank's
// gradient covers its heads and DataParallel sums them over tp (ParamSpec::tp_partial_grad).
// Gradients: dxn written (=); parameter gradients accumulated (+=).
#pragma once
#include <unordered_map>

#include "config/config.h"
#include "layers/common.h"
#include "layers/linear.h"
#include "layers/lora.h"
#include "ops/attention.h"

namespace engine::layers {

// Micro-sequences: one micro-batch's token rows run as consecutive chunks, forward in order and
// backward in reverse; a chunk's queries also attend to the keys and values of earlier chunks.
// The chunks of one micro-batch share this object, which keeps for each attention layer the
// keys and values of every row (written by each chunk's forward) and the f32 sum of the
// gradients of those keys and values (every later chunk's backward adds to the rows it saw; a
// chunk's own rows are complete when its backward runs, since later chunks went first).
struct KvChunks {
  int64_t rows = 0;  // the micro-batch's token rows (all chunks)
  struct Layer {
    Owned kv;   // (rows, 2 Hkv, D) activations
    Owned dkv;  // (rows, 2 Hkv, D) statistics dtype (f32 / f64), allocated by the last chunk's backward
  };
  std::unordered_map<const void*, Layer> layers;  // by attention layer
};

struct SegmentInfo {  // one micro-batch's varlen layout, on the compute device
  Tensor cu_seqlens;  // (S + 1) i32
  Tensor positions;   // (T) i32, or (T, 2): the row and column of image patches (2-D RoPE)
  int max_seqlen = 0;
  // Micro-sequences (kv set): this chunk is rows [row_begin, row_begin + T) of the micro-batch,
  // its keys rows [key_begin, row_begin + T), cu_seqlens_k their segments (data/varlen.h).
  KvChunks* kv = nullptr;
  Tensor cu_seqlens_k = {};  // (S + 1) i32
  int max_seqlen_k = 0;
  int64_t row_begin = 0, key_begin = 0;
  // A forward without backward (evaluation, a teacher) on the micro-batch's last chunk: each
  // layer drops its keys and values once it has used them.
  bool kv_release = false;
};

// Text generation: the keys and values of every position decoded so far (one sequence).
struct AttentionCache {
  Owned kv;         // (capacity, 2 Hkv, D) activations: k heads, then v heads, RoPE applied to k
  int64_t len = 0;  // positions filled
};

struct AttentionSaved {
  Owned qkv;  // (T, H + 2 Hkv, D)
  Owned out;  // (T, H, D)
  Owned lse;  // (T, H)
  Owned qk_in;    // qk_norm: (T, H + Hkv, D) the q and k heads before the norm
  Owned qk_rstd;  // qk_norm: (T, H + Hkv) statistics dtype
  LinearAmaxes qkv_amax, out_amax;  // FP8: the q/k/v and output linears' amaxes (layers/linear.h)
};

class Attention {
 public:
  Attention() = default;
  Attention(const ParamStore& store, const std::string& prefix, const ModelConfig& c);
  static void declare(ParamTable& t, const std::string& prefix, const ModelConfig& c);

  // xn_amax: xn's FP8 amax where the kernel that wrote xn computed it (layers/linear.h).
  void forward(const Env& env, const Tensor& xn, const SegmentInfo& seg, const Tensor& y,
               AttentionSaved& s, Fp8Amax xn_amax = {}) const;
  // The gradients of the input and of every parameter (the layer on its own).
  void backward(const Env& env, const Tensor& dy, const Tensor& xn, const SegmentInfo& seg,
                const AttentionSaved& s, const Tensor& dxn) const;
  // The same but for the output bias, whose gradient (sum_t dy, out_bias_grad()) the caller adds:
  // Block sums it in the norm backward that wrote dy (ops/norm.h dx_colsum; layers/block.h).
  void backward_except_out_bias(const Env& env, const Tensor& dy, const Tensor& xn,
                                const SegmentInfo& seg, const AttentionSaved& s,
                                const Tensor& dxn) const;
  // The output bias's gradient (undefined without one): sum_t dy over this rank's rows.
  Tensor out_bias_grad() const { return bo_ ? bo_.g() : Tensor{}; }

  // One-token decode (layers/decode.cpp): xn (1, C) is the next token of the sequence whose
  // keys and values `cache` holds, at position `position` ((1) i32 on the device, = cache.len);
  // its q, k, v are projected, rotated, its k and v appended to the cache, and its query attends
  // to every cached key within the window (ops/decode.h). y (1, C) as forward writes it. One
  // rank: no tensor parallelism.
  void decode(const Env& env, const Tensor& xn, const Tensor& position, AttentionCache& cache,
              const Tensor& y) const;
  AttentionCache new_cache(const Env& env, int64_t capacity) const;

 private:
  ops::AttentionParams op_params(const SegmentInfo& seg, const AttentionSaved& s) const;
  // LoRA (layers/lora.h): the q, k, v adapters' terms added to the fused qkv rows from x, and
  // the output adapter's term on x = o (nullptr without one), for row_linear_forward.
  void lora_qkv_forward(const Tensor& x, const Tensor& qkv) const;
  std::function<void(const Tensor&)> lora_out(const Tensor& o) const;
  int heads_ = 0, kv_heads_ = 0, head_dim_ = 0, window_ = 0;
  bool causal_ = true;  // ModelConfig::causal
  bool rope_ = false;
  ops::AttentionBackend backend_ = ops::AttentionBackend::Flash;  // model.attention_backend
  ops::RopeParams rope_params_;  // model.rope_theta and model.rope_scaling
  float norm_eps_ = 1e-6f;
  Param wqkv_, bqkv_, wo_, bo_;
  Param qk_norm_;  // (2, D): q_norm, k_norm (adjacent); undefined without qk_norm
  Lora lora_q_, lora_k_, lora_v_, lora_o_;  // empty unless lora.targets names them
};

}  // namespace engine::layers
