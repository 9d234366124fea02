// The trainer's forward and backward over one global batch (Trainer::run_batch: the loss-token
// counts, the micro-batches, the pipeline, the losses summed over the groups) and the
// validation pass over training.eval_steps batches.
#include <cmath>
#include <cstdio>

#include "core/log.h"
#include "models/prediction_targets.h"
#include "train/trainer.h"

namespace engine {

double Trainer::run_batch(const SampleSource& source, int64_t first, int64_t count, bool with_grad,
                          int64_t* loss_tokens, std::vector<double>* head_sums, std::vector<int64_t>* head_tokens) {
  const int mbs = config_.batch.micro_batch_size;
  const int heads = config_.model.prediction_heads;
  // This rank's contiguous part of the global batch.
  count /= dp_.size();
  first += count * dp_.rank();
  // The whole global batch is read first: its loss-token count normalises every micro-batch
  // (with multi-token prediction, each extra head's count normalises that head's loss).
  std::vector<Sample> samples(static_cast<size_t>(count));
  int64_t tokens = 0;
  std::vector<int64_t> extra(static_cast<size_t>(heads), 0);
  for (int64_t i = 0; i < count; ++i) {
    samples[static_cast<size_t>(i)] = source.get(first + i);
    for (uint8_t m : samples[static_cast<size_t>(i)].loss_mask) tokens += m != 0;
    for (int j = 1; j <= heads; ++j)
      extra[static_cast<size_t>(j - 1)] += prediction_loss_tokens(samples[static_cast<size_t>(i)], j);
  }
  tokens = dp_.all_reduce_sum(tokens);  // the global batch's loss tokens normalise every rank
  *loss_tokens += tokens;
  const float grad_scale = tokens > 0 ? 1.f / static_cast<float>(tokens) : 0.f;
  std::vector<float> extra_scale(static_cast<size_t>(heads));
  for (size_t j = 0; j < extra.size(); ++j) {
    extra[j] = dp_.all_reduce_sum(extra[j]);
    (*head_tokens)[j] += extra[j];
    extra_scale[j] = extra[j] > 0 ? 1.f / static_cast<float>(extra[j]) : 0.f;
  }
  std::vector<MicroBatch> batches;
  for (int64_t b = 0; b < count; b += mbs) {
    std::vector<const Sample*> seqs;
    for (int64_t i = b; i < std::min(count, b + mbs); ++i) seqs.push_back(&samples[static_cast<size_t>(i)]);
    // Micro-sequences: the micro-batch as consecutive chunks, which the pipeline runs as units.
    for (MicroBatch& mb : make_micro_sequences(seqs, config_.data.sequence_length,
                                               config_.data.cross_document_attention, device_,
                                               config_.batch.micro_sequence_length, heads)) {
      mb.jitter_seed = router_jitter_seed(config_.run.seed, first + b, mb.chunk);
      mb.mtp_grad_scale = extra_scale;
      log_debug("samples [", first + b, ", ", first + b + static_cast<int64_t>(seqs.size()), ") chunk ", mb.chunk,
                "/", mb.chunks, ": ", mb.loss_tokens, " loss tokens, ", mb.cu_seqlens->numel() - 1,
                " segments (longest ", mb.max_seqlen, ")");
      batches.push_back(std::move(mb));
    }
  }
  // The last micro-batch's backward starts the gradient reduction bucket by bucket.
  double loss_sum = pipeline_->run(batches, with_grad, grad_scale,
                                   [this](int64_t at) { parallel_->grads_ready(at); });
  if (mesh_->pp()) loss_sum = mesh_->pp()->all_reduce_sum(loss_sum);  // from the last stage's rank
  if (heads > 0) {
    std::vector<double> sums = model_->take_prediction_losses();
    for (size_t j = 0; j < sums.size(); ++j) {
      double v = mesh_->pp() ? mesh_->pp()->all_reduce_sum(sums[j]) : sums[j];
      (*head_sums)[j] += dp_.all_reduce_sum(v);
    }
  }
  return dp_.all_reduce_sum(loss_sum);
}

std::string Trainer::head_loss_text(const std::vector<double>& losses) {
  std::string s;
  char buf[64];
  for (size_t h = 0; h < losses.size(); ++h) {
    std::snprintf(buf, sizeof buf, " | head %zu %.4f", h + 1, losses[h]);
    s += buf;
  }
  return s;
}
std::vector<double> Trainer::head_means(const std::vector<double>& sums, const std::vector<int64_t>& tokens, double none) {
  std::vector<double> out(sums.size());
  for (size_t j = 0; j < sums.size(); ++j) out[j] = tokens[j] ? sums[j] / static_cast<double>(tokens[j]) : none;
  return out;
}

double Trainer::evaluate() {
  if (!valid_data_) return NAN;
  const int64_t gb = config_.batch.global_batch_size;
  optimizer_->begin_step();  // ZeRO-3: the weights are gathered only around a step
  double loss_sum = 0;
  int64_t loss_tokens = 0;
  const size_t heads = static_cast<size_t>(config_.model.prediction_heads);
  std::vector<double> head_sums(heads, 0.0);
  std::vector<int64_t> head_tokens(heads, 0);
  for (int i = 0; i < config_.training.eval_steps; ++i)
    loss_sum += run_batch(*valid_data_, int64_t{i} * gb, gb, false, &loss_tokens, &head_sums, &head_tokens);
  valid_head_losses_ = head_means(head_sums, head_tokens, NAN);
  return loss_tokens ? loss_sum / static_cast<double>(loss_tokens) : NAN;
}

}  // namespace engine
