#include "models/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "config/config_fields.h"
#include "core/log.h"
#include "core/params.h"
#include "layers/block.h"
#include "layers/embedding.h"
#include "layers/lm_head.h"
#include "layers/lora.h"
#include "ops/gemm.h"
#include "ops/delta.h"
#include "ops/ssd.h"

namespace engine {
namespace {

int kind_index(char letter) {
  return letter == 'E' ? 1 : letter == 'M' ? 2 : letter == 'S' ? 3 : letter == 'G' ? 4 : 0;
}
constexpr int kKinds = 5;
constexpr const char* kKindNames[kKinds] = {"attention + MLP", "attention + experts", "Mamba", "Mamba-2",
                                            "Gated DeltaNet + MLP"};

// An integer-valued double exactly below 1e15, else in %.3g.
std::string num(double v) {
  char buf[48];
  if (std::fabs(v) < 1e15 && v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// The blocks of each kind on pipeline rank r (its stages r, r + pp, ... of pp x k, each holding
// blocks [s L / S, (s + 1) L / S) as Transformer::stage_plan splits them), the first index of
// each kind, and whether the rank holds the embedding (stage 0) and the head (stage S - 1).
struct RankLayers {
  double count[kKinds] = {0, 0, 0, 0, 0};
  int first[kKinds] = {-1, -1, -1, -1, -1};
  bool embedding = false, head = false;
  double total() const { return count[0] + count[1] + count[2] + count[3] + count[4]; }
};

RankLayers rank_layers(const ModelConfig& m, int pp, int k, int r) {
  RankLayers out;
  const bool hybrid = m.family == ModelFamily::Hybrid;
  const int64_t L = hybrid ? std::min<int64_t>(std::max(0, m.num_layers), static_cast<int64_t>(m.hybrid_layout.size()))
                           : std::max(0, m.num_layers);
  const int64_t S = std::max<int64_t>(1, int64_t{pp} * k);
  out.embedding = r == 0;
  out.head = (S - 1) % pp == r;
  auto bound = [&](int64_t s) { return static_cast<int64_t>(static_cast<__int128>(s) * L / S); };
  auto add = [&](int64_t b, int64_t e) {
    if (b >= e) return;
    if (!hybrid) {
      const int i = kind_index(block_letter(m, 0));
      out.count[i] += static_cast<double>(e - b);
      if (out.first[i] < 0) out.first[i] = static_cast<int>(b);
      return;
    }
    for (int64_t l = b; l < e; ++l) {
      const int i = kind_index(m.hybrid_layout[static_cast<size_t>(l)]);
      out.count[i] += 1;
      if (out.first[i] < 0) out.first[i] = static_cast<int>(l);
    }
  };
  if (hybrid || k <= (1 << 16)) {
    for (int64_t s = r; s < S; s += pp) add(bound(s), bound(s + 1));
  } else {  // (a lower bound in O(1): k stages of at least floor(L / S) blocks each)
    const int i = kind_index(block_letter(m, 0));
    out.count[i] = static_cast<double>(k) * static_cast<double>(L / S);
    out.first[i] = static_cast<int>(bound(r));
  }
  return out;
}

// This rank's share of a table's parameters (a whole-model table: split ones are 1/tp).
// trainable: only those not frozen (LoRA freezes the base: no gradient, no optimizer state).
double local_parameters(const ParamTable& t, int tp, bool trainable = false) {
  double n = 0;
  for (const ParamSpec& s : t.entries())
    if (!trainable || !s.frozen) n += static_cast<double>(s.shape.numel()) / (s.split_dim >= 0 ? tp : 1);
  return n;
}

// The model key with the largest value, where a shape overflows.
const char* largest_model_key(const ModelConfig& m) {
  const std::pair<const char*, int> keys[] = {{"model.hidden_size", m.hidden_size},
                                              {"model.ffn_hidden_size", m.ffn_hidden_size},
                                              {"model.vocab_size", m.vocab_size},
                                              {"model.head_dim", m.head_dim},
                                              {"model.num_heads", m.num_heads},
                                              {"model.max_position_embeddings", m.max_position_embeddings}};
  return std::max_element(std::begin(keys), std::end(keys), [](auto& a, auto& b) { return a.second < b.second; })->first;
}

// This rank's parameters of model m: the layers' own declarations of the embedding, the head and
// one block per kind (block_params: per block of each kind).
// `trainable` (optional): of them, those with gradients and optimizer state.
double rank_parameters(const Config& c, const ModelConfig& m, const RankLayers& layers, int tp, double block_params[kKinds],
                       double* trainable = nullptr) {
  double params = 0, train = 0;
  auto table = [&] {
    ParamTable t;
    layers::set_lora_freezing(t, m);
    return t;
  };
  try {
    if (layers.embedding) {
      ParamTable t = table();
      layers::Embedding::declare(t, m);
      params += local_parameters(t, tp);
      train += local_parameters(t, tp, true);
    }
    if (layers.head) {
      ParamTable t = table();
      layers::LmHead::declare(t, m);
      params += local_parameters(t, tp);
      train += local_parameters(t, tp, true);
      if (m.tie_embeddings && !layers.embedding)  // the head's copy of the tied table
        params += static_cast<double>(m.vocab_size) * m.hidden_size / tp;
      if (m.prediction_heads > 0) {  // multi-token prediction: each extra head's block and norm
        ParamTable h;
        layers::Block::declare(h, "mtp.1", layers::block_kind(m, m.num_layers - 1), m);
        layers::Norm::declare(h, "mtp.1.norm", m.hidden_size, m.norm, m.bias);
        params += m.prediction_heads * local_parameters(h, tp);
      }
    }
    for (int i = 0; i < kKinds; ++i) {
      if (layers.count[i] == 0) continue;
      ParamTable t = table();
      layers::Block::declare(t, layers.first[i], m);
      block_params[i] = local_parameters(t, tp);
      params += layers.count[i] * block_params[i];
      train += layers.count[i] * local_parameters(t, tp, true);
    }
  } catch (const Error& e) {
    const char* key = &m == &c.model ? largest_model_key(m) : "distillation.teacher";
    RAISE(c.where(key), "this model's parameters cannot be counted in 64-bit integers: ", e.what());
  }
  if (trainable) *trainable = m.tie_embeddings && layers.head && !layers.embedding && m.lora.rank == 0
                                  ? train + static_cast<double>(m.vocab_size) * m.hidden_size / tp
                                  : train;
  return params;
}

}  // namespace

double MemoryEstimate::device_bytes() const {
  double b = 0;
  for (const MemoryPart& p : parts) b += p.host ? 0 : p.bytes;
  return b;
}

double MemoryEstimate::host_bytes() const {
  double b = 0;
  for (const MemoryPart& p : parts) b += p.host ? p.bytes : 0;
  return b;
}

MemoryEstimate estimate_memory(const Config& c, const RankPlacement& p, const ModelConfig* teacher) {
  const ModelConfig& m = c.model;
  const DistributedConfig& d = c.distributed;
  const int tp = std::max(1, p.tp), dp = std::max(1, p.dp), pp = std::max(1, p.pp);
  const RankLayers layers = rank_layers(m, pp, std::max(1, d.stages_per_rank), p.pp_rank);

  double block_params[kKinds] = {0, 0, 0, 0, 0};
  double trainable = 0;
  const double params = rank_parameters(c, m, layers, tp, block_params, &trainable);
  const bool moe = layers.count[1] > 0, mamba = layers.count[2] + layers.count[3] > 0;

  const double a = static_cast<double>(dtype_size(p.compute));
  const std::string dtype = dtype_name(p.compute);
  MemoryEstimate est;
  std::string model_keys = str_cat("model.vocab_size ", m.vocab_size, ", model.hidden_size ", m.hidden_size,
                                   ", model.num_layers ", m.num_layers, " (", num(layers.total()), " on this rank)");
  if (layers.count[0] + layers.count[1] + layers.count[4] > 0) model_keys += str_cat(", model.ffn_hidden_size ", m.ffn_hidden_size);
  if (moe) model_keys += str_cat(", model.num_experts ", m.num_experts);
  if (mamba) model_keys += str_cat(", model.mamba_expand ", m.mamba_expand);
  if (tp > 1) model_keys += str_cat(", distributed.tensor_parallel ", tp);
  if (pp > 1) model_keys += str_cat(", distributed.pipeline_parallel ", pp);
  est.parts.push_back({"parameters", false, params * a,
                       str_cat(num(params), " parameters on this rank x ", num(a), " bytes (", dtype, "): ", model_keys)});
  const std::string frozen = trainable < params ? str_cat(" (", num(trainable), " trainable: lora.rank ", m.lora.rank,
                                                          " freezes the rest)") : "";
  est.parts.push_back({"gradients", false, trainable * 4, "one f32 per trainable parameter" + frozen});

  const bool sharded = d.zero_stage >= 1 && dp > 1;
  // The master weights (optim/adamw.h): none beside f32 weights that stay resident (they are the
  // master), the 16 low bits of each beside resident bf16 weights (a split master), else f32.
  const bool resident = d.zero_stage < 3;
  const double master = resident && p.compute == DType::F32 ? 0 : resident && p.compute == DType::BF16 ? 2 : 4;
  const double shard = sharded ? trainable / dp : trainable;
  est.parts.push_back(
      {"optimizer state", false, shard * (master + 8),
       str_cat(master == 0 ? "two f32 moments" : master == 2 ? "the master weights' low 16 bits and two f32 moments"
                                                             : "f32 master weights and two f32 moments",
               " of ", num(shard),
               " parameters (distributed.zero_stage ", d.zero_stage, " over ", dp, " data-parallel rank(s)",
               sharded ? ": 1/" + std::to_string(dp) + " of this rank's" : ": all of this rank's", ")")});

  // Activations kept for backward, per micro-batch, at T tokens (T / tp between the parallel
  // regions under sequence parallelism).
  const double T = static_cast<double>(c.batch.micro_batch_size) * c.data.sequence_length;
  const double Tsp = d.sequence_parallel && tp > 1 ? T / tp : T;
  const double C = m.hidden_size, H = m.num_heads, Hkv = m.num_kv_heads, D = m.head_dim, F = m.ffn_hidden_size;
  const double glu = m.activation == ActivationKind::SwiGLU ? 2 : 1, Di = static_cast<double>(m.mamba_expand) * C;
  // q, k, v and the output (with model.qk_norm also the q and k heads before the norm)
  const double attention = T * (2 * H + 2 * Hkv + (m.qk_norm ? H + Hkv : 0)) * D / tp;
  double per_block[kKinds];
  if (c.training.recompute_activations) {
    per_block[0] = per_block[1] = per_block[2] = per_block[3] = per_block[4] = Tsp * C;  // the block's output
  } else {
    per_block[0] = 4 * Tsp * C + attention + T * F * (glu + 1) / tp;                        // + MLP h, a
    const double Fe = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : F, Fs = m.moe_shared_expert_ffn_size;
    per_block[1] = 4 * Tsp * C + attention + T * m.experts_per_token * (3 * Fe / tp + C)    // + experts h, a, y
                   + (Fs > 0 ? T * 3 * Fs / tp + Tsp * C : 0);                             // + shared h, a, y
    per_block[2] = 2 * Tsp * C + 4 * T * Di / tp;                                           // + xz, dt, y
    // Mamba-2: the in_proj output [z | x | B | C | dt], y, and the f32 chunk states (Mamba2Config's
    // chunk_len tokens a chunk) counted in units of the compute dtype.
    const double GN = static_cast<double>(m.mamba_n_groups) * m.mamba_d_state;
    const double heads = m.mamba_head_dim > 0 ? Di / m.mamba_head_dim : 0;
    per_block[3] = 2 * Tsp * C + T * (3 * Di + 2 * GN + heads) / tp +
                   std::ceil(T / static_cast<double>(layers::Mamba2Config{}.chunk_len)) * Di * m.mamba_d_state / tp *
                       4 / a;
    // Gated DeltaNet + MLP: the attention block's residual tensors and MLP, the in_proj output
    // [q | k | v | z | b | a], o and the norm's rstd (a statistic: f32, f64 in an f64 model) in
    // place of q, k, v and the attention output.
    const double qk = static_cast<double>(m.gdn_num_key_heads) * m.gdn_key_head_dim,
                 vw = static_cast<double>(m.gdn_num_value_heads) * m.gdn_value_head_dim,
                 hv = m.gdn_num_value_heads;
    per_block[4] = 4 * Tsp * C + T * (2 * qk + 3 * vw + 2 * hv + hv * std::max(a, 4.0) / a) / tp +
                   T * F * (glu + 1) / tp;
  }
  double per_micro = layers.embedding ? Tsp * C : 0;  // the embedding's output
  for (int i = 0; i < kKinds; ++i) per_micro += layers.count[i] * per_block[i];
  // Multi-token prediction (last stage): each extra head keeps its block's activations (none
  // with recomputation) and its head's input gradient until the backward.
  const int last_kind = kind_index(block_letter(m, m.num_layers - 1));
  const double per_extra_head = (c.training.recompute_activations ? 0 : per_block[last_kind]) + Tsp * C;
  const double extra_heads = layers.head ? m.prediction_heads : 0;
  per_micro += extra_heads * per_extra_head;
  const int64_t micro = std::max<int64_t>(
      1, c.batch.global_batch_size / std::max<int64_t>(1, int64_t{c.batch.micro_batch_size} * dp));
  int64_t in_flight = 1;
  if (d.pipeline_schedule == ScheduleKind::BreadthFirst) in_flight = micro;
  else if (d.pipeline_schedule == ScheduleKind::OneFOneB && d.stages_per_rank == 1)
    in_flight = std::min<int64_t>(pp - p.pp_rank, micro);
  std::string blocks;
  for (int i = 0; i < kKinds; ++i)
    if (layers.count[i] > 0)
      blocks += str_cat(blocks.empty() ? "" : ", ", num(layers.count[i]), " ", kKindNames[i], " block(s) of ",
                        format_bytes(per_block[i] * a));
  if (extra_heads > 0)
    blocks += str_cat(", ", num(extra_heads), " extra prediction head(s) of ", format_bytes(per_extra_head * a),
                      " (model.prediction_heads: a ", kKindNames[last_kind], " block and the head's input gradient)");
  est.parts.push_back(
      {"activations", false, static_cast<double>(in_flight) * per_micro * a,
       str_cat(in_flight, " micro-batch(es) in flight (distributed.pipeline_schedule \"",
               config_detail::enum_name(d.pipeline_schedule, config_detail::names_of(config_detail::kScheduleNames)),
               "\"; ", micro, " per step: batch.global_batch_size ", c.batch.global_batch_size, " / (micro_batch_size x ",
               dp, " data-parallel rank(s))) x ", num(T), " tokens (batch.micro_batch_size ", c.batch.micro_batch_size,
               " x data.sequence_length ", c.data.sequence_length, ") kept for backward by ",
               blocks.empty() ? "no blocks" : blocks, " per micro-batch (training.recompute_activations ",
               c.training.recompute_activations ? "true" : "false", ")")});

  if (layers.head) {
    const int msl = c.batch.micro_sequence_length;
    const double unit = msl > 0 ? static_cast<double>(c.batch.micro_batch_size) * msl : T;
    const int splits = resolved_cross_entropy_splits(c);
    const double rows = std::ceil(unit / splits), cols = static_cast<double>(m.vocab_size) / tp;
    const bool teacher = !c.distillation.teacher.empty();
    est.parts.push_back({"logits", false, (rows + (teacher ? unit : 0)) * cols * a,
                         str_cat(num(rows), " tokens (", num(unit), " / distributed.cross_entropy_splits ",
                                 splits, d.cross_entropy_splits == 0 ? " (0: auto)" : "", ") x ", num(cols), " vocabulary columns (model.vocab_size ",
                                 m.vocab_size, tp > 1 ? str_cat(" / ", tp) : "", ") x ", num(a), " bytes",
                                 teacher ? ", and the teacher's logits of the whole unit" : "",
                                 m.prediction_heads > 0
                                     ? str_cat(" (the next-token head and the ", m.prediction_heads,
                                               " extra heads of model.prediction_heads each run their chunks in turn)")
                                     : "")});
  }

  // A distillation teacher: its whole model on the ranks of the student's last stage (split over
  // the same tensor-parallel group), weights only (it runs forward, no gradients or state).
  if (teacher && layers.head) {
    double teacher_blocks[kKinds] = {0, 0, 0, 0, 0};
    const double n = rank_parameters(c, *teacher, rank_layers(*teacher, 1, 1, 0), tp, teacher_blocks);
    est.parts.push_back({"teacher", false, n * a,
                         str_cat(num(n), " teacher parameters on this rank x ", num(a), " bytes (", dtype,
                                 "): distillation.teacher ", c.distillation.teacher, " (", teacher->num_layers,
                                 " layers, hidden ", teacher->hidden_size, tp > 1 ? str_cat(", / ", tp) : "", ")")});
  }
  if (p.device == Device::CUDA)
    est.parts.push_back({"workspaces", false, static_cast<double>(ops::kGemmWorkspaceBytes),
                         "the GEMM library's (cuBLASLt) workspace, allocated once"});
  if (p.device == Device::CUDA && layers.count[kind_index('S')] > 0 && m.mamba_head_dim > 0) {
    // One Mamba-2 layer's scan backward at a time holds its workspaces (ops/ssd.h).
    const int64_t tokens = static_cast<int64_t>(T), heads = static_cast<int64_t>(Di) / m.mamba_head_dim;
    const double bytes = static_cast<double>(ops::ssd_backward_workspace_bytes(
        tokens, heads / tp, m.mamba_head_dim, m.mamba_n_groups / tp, m.mamba_d_state, layers::Mamba2Config{}.chunk_len));
    est.parts.push_back({"Mamba-2 scan backward", false, bytes,
                         str_cat("one layer's scan backward workspaces at ", num(T), " tokens (the gradient of every "
                                 "chunk's end state, the sub-chunks' entering states, dB and dC partial sums)")});
  }

  if (p.device == Device::CUDA && layers.count[kind_index('G')] > 0) {
    // One Gated DeltaNet layer's backward at a time holds its workspaces (ops/delta.h), at most
    // one document a token.
    const int64_t tokens = static_cast<int64_t>(T);
    const double bytes = static_cast<double>(ops::gated_delta_workspace_bytes(
        tokens, tokens, m.gdn_num_key_heads / tp, m.gdn_num_value_heads / tp, m.gdn_key_head_dim, m.gdn_value_head_dim,
        true));
    est.parts.push_back({"Gated DeltaNet backward", false, bytes,
                         str_cat("one layer's chunked backward workspaces at ", num(T), " tokens (q^, k^, the WY "
                                 "factors U and W, the deltas, the chunks' entering states and their gradients, "
                                 "per-value-head dq^ and dk^)")});
  }

  const double samples = static_cast<double>(c.training.steps) * c.batch.global_batch_size +
                         (c.training.eval_every > 0 ? static_cast<double>(c.training.eval_steps) * c.batch.global_batch_size : 0);
  const double per_sample = c.data.truncate_documents ? 12 : 8;  // start position (+ offset in a document)
  est.parts.push_back({"sample plan", true, samples * per_sample,
                       str_cat(num(samples), " samples (training.steps ", c.training.steps, " x batch.global_batch_size ",
                               c.batch.global_batch_size, c.training.eval_every > 0 ? ", + validation" : "", ") x ",
                               num(per_sample), " bytes (data.truncate_documents ",
                               c.data.truncate_documents ? "true" : "false", ")")});
  return est;
}

namespace {

// The keys whose value scales the estimate, each halved in turn: the one whose halving saves the
// most of `total` is the one the message names first.
std::string driving_key(const Config& c, const RankPlacement& p, const ModelConfig* teacher,
                        const std::function<double(const MemoryEstimate&)>& total) {
  const double base = total(estimate_memory(c, p, teacher));
  struct Key {
    const char* name;
    std::function<int&(Config&)> field;
  };
  const Key keys[] = {
      {"model.hidden_size", [](Config& x) -> int& { return x.model.hidden_size; }},
      {"model.num_layers", [](Config& x) -> int& { return x.model.num_layers; }},
      {"model.vocab_size", [](Config& x) -> int& { return x.model.vocab_size; }},
      {"model.ffn_hidden_size", [](Config& x) -> int& { return x.model.ffn_hidden_size; }},
      {"model.num_experts", [](Config& x) -> int& { return x.model.num_experts; }},
      {"model.mamba_expand", [](Config& x) -> int& { return x.model.mamba_expand; }},
      {"model.head_dim", [](Config& x) -> int& { return x.model.head_dim; }},
      {"model.max_position_embeddings", [](Config& x) -> int& { return x.model.max_position_embeddings; }},
      {"batch.micro_batch_size", [](Config& x) -> int& { return x.batch.micro_batch_size; }},
      {"data.sequence_length", [](Config& x) -> int& { return x.data.sequence_length; }},
      {"batch.global_batch_size", [](Config& x) -> int& { return x.batch.global_batch_size; }},
      {"training.steps", [](Config& x) -> int& { return x.training.steps; }},
  };
  std::string best;
  double best_saving = 0;
  for (const Key& k : keys) {
    Config half = c;
    int& v = k.field(half);
    if (v < 2) continue;
    v /= 2;
    if (&v == &half.model.hidden_size) {  // with the sizes derived from it (where the config did not set them)
      if (!c.origin.count("model.head_dim")) half.model.head_dim = std::max(1, half.model.head_dim / 2);
      if (!c.origin.count("model.ffn_hidden_size")) half.model.ffn_hidden_size = std::max(1, half.model.ffn_hidden_size / 2);
    }
    double saving = 0;
    try {
      saving = base - total(estimate_memory(half, p, teacher));
    } catch (const Error&) {
      continue;
    }
    if (saving > best_saving) best_saving = saving, best = k.name;
  }
  return best.empty() ? "model.hidden_size" : best;
}

std::string breakdown(const MemoryEstimate& e, bool device_parts, bool host_parts) {
  std::string s;
  for (const MemoryPart& part : e.parts) {
    if (!(part.host ? host_parts : device_parts)) continue;
    char name[24];
    std::snprintf(name, sizeof name, "%-16s", part.name.c_str());
    s += str_cat("\n  ", name, " ", format_bytes(part.bytes), ": ", part.detail);
  }
  return s;
}

}  // namespace

void check_memory(const Config& c, const RankPlacement& p, const std::vector<MemoryPool>& pools, int rank,
                  const ModelConfig* teacher) {
  const MemoryEstimate mine = estimate_memory(c, p, teacher);
  const bool cpu = p.device == Device::CPU;
  for (size_t i = 0; i < pools.size(); ++i) {
    const MemoryPool& pool = pools[i];
    if (!pool.known) continue;
    // On the CPU everything is host memory; on a GPU the first pool is the device's.
    const bool device_pool = !cpu && i == 0, host_pool = cpu || i > 0;
    auto total = [&](const MemoryEstimate& e) {
      return (device_pool ? e.device_bytes() : 0) + (host_pool ? e.host_bytes() + (cpu ? e.device_bytes() : 0) : 0);
    };
    const double need = total(mine);
    double least = need;  // the smallest need over the pipeline ranks (the ranks that share the pool)
    if (pool.sharing > 1)
      for (int r = 0; r < p.pp; ++r) {
        RankPlacement q = p;
        q.pp_rank = r;
        least = std::min(least, total(estimate_memory(c, q, teacher)));
      }
    const bool over_now = need > pool.available, over_all = pool.sharing * least > pool.capacity;
    if (!over_now && !over_all) continue;
    const std::string key = driving_key(c, p, teacher, total);
    const std::string what =
        over_now ? str_cat("this run needs at least ", format_bytes(need), " of ", pool.name, " on rank ", rank, ", and ",
                           format_bytes(pool.available), " are available (", pool.source, ")")
                 : str_cat("this run needs at least ", format_bytes(least), " of ", pool.name, " on each of the ",
                           pool.sharing, " or more ranks sharing it, ", format_bytes(pool.sharing * least),
                           " in all, and it holds ", format_bytes(pool.capacity), " (", pool.source, ")");
    RAISE(c.where(key), what, "; the estimate, a lower bound, per part:",
          breakdown(mine, device_pool || cpu, host_pool),
          "\n  halving ", key, " saves the most; see README.md (Failure behaviour: memory)");
  }
}

}  // namespace engine
