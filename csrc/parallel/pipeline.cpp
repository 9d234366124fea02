#include "parallel/pipeline.h"

#include <map>
#include <string>

#include "core/buffer.h"

namespace engine {

Pipeline::Pipeline(Model& model, Comm* pp, ScheduleKind kind)
    : model_(model), pp_(pp && pp->size() > 1 ? pp : nullptr), kind_(kind) {
  layout_.stages = model.num_stages();
  layout_.ranks = pp_ ? pp_->size() : 1;
  rank_ = pp_ ? pp_->rank() : 0;
  ENSURE(layout_.stages % layout_.ranks == 0, layout_.stages, " stages over ", layout_.ranks, " pipeline ranks");
  for (int s = 0; s < layout_.stages; ++s)
    ENSURE(model.has_stage(s) == (layout_.rank_of(s) == rank_), "stage ", s, " placement");
  if (!pp_ || std::string(pp_->backend()) != "nccl") return;
  const int P = layout_.ranks;
  for (int i = 0; i < P; ++i) {
    const int next = (i + 1) % P;
    const bool member = rank_ == i || rank_ == next;
    // Every rank takes part in every split; non-members end up alone (unused).
    fwd_.push_back(pp_->split(member ? 0 : 1 + rank_, rank_ == i ? 0 : 1));  // sender i is rank 0
    bwd_.push_back(pp_->split(member ? 0 : 1 + rank_, rank_ == next ? 0 : 1));  // sender next is rank 0
  }
}

Pipeline::~Pipeline() = default;

void Pipeline::send(const Tensor& t, int to_stage, bool backward, int tag) {
  const int to = layout_.rank_of(to_stage);
  Owned copy = empty(t.shape, t.dtype, t.device);  // the caller's tensor may be freed before delivery
  copy_tensor(copy, t);
  if (fwd_.empty()) {
    pp_->send_async(copy, to, tag);
  } else {
    Comm& c = backward ? *bwd_[static_cast<size_t>(to)] : *fwd_[static_cast<size_t>(rank_)];
    c.send_async(copy, 1, tag);  // the receiver is rank 1 of the channel
  }
  pending_.push_back(std::move(copy));
}

void Pipeline::recv(const Tensor& t, int from_stage, bool backward, int tag) {
  const int from = layout_.rank_of(from_stage);
  if (fwd_.empty()) return pp_->recv(t, from, tag);
  Comm& c = backward ? *bwd_[static_cast<size_t>(rank_)] : *fwd_[static_cast<size_t>(from)];
  c.recv(t, 0, tag);
}

double Pipeline::run(const std::vector<MicroBatch>& mbs, bool with_grad, float grad_scale,
                     const Model::GradsReady& grads_ready) {
  const int S = layout_.stages, M = static_cast<int>(mbs.size());
  const int chunks = mbs.empty() ? 1 : mbs.front().chunks;  // micro-sequences: M counts the chunks
  for (int m = 0; m < M; ++m)
    ENSURE(mbs[static_cast<size_t>(m)].chunks == chunks && mbs[static_cast<size_t>(m)].chunk == m % chunks,
           "micro-batch ", m, " is chunk ", mbs[static_cast<size_t>(m)].chunk, " of ",
           mbs[static_cast<size_t>(m)].chunks, " (expected chunk ", m % chunks, " of ", chunks, ")");
  const std::vector<PipelineStep> steps =
      steps_of_rank(build_schedule(layout_, M, kind_, with_grad, chunks), layout_, rank_);
  // The last backward of each stage: where its parameters' gradients become complete.
  std::map<int, size_t> last_backward;
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].backward) last_backward[steps[i].stage] = i;

  std::map<int, std::unique_ptr<Model::Saved>> saved;  // by stage * M + micro-batch
  std::map<int, Owned> received;                       // inputs and output gradients from other ranks
  auto key = [M](int s, int m) { return s * M + m; };
  double loss = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PipelineStep& st = steps[i];
    const int s = st.stage, m = st.micro_batch, k = key(s, m);
    const MicroBatch& mb = mbs[static_cast<size_t>(m)];
    if (!st.backward) {
      Tensor input;
      if (s > 0) {
        if (model_.has_stage(s - 1)) {
          input = model_.stage_output(*saved.at(key(s - 1, m)));
        } else {
          Owned buf = empty(model_.stage_activation_shape(mb), model_.activation_dtype(), model_.params().device());
          recv(buf, s - 1, false, pipeline_tag(layout_, M, false, s, m));
          input = buf;
          received[k] = std::move(buf);
        }
      }
      auto& sv = saved[k] = model_.new_saved();
      loss += model_.forward_stage(s, mb, *sv, input, with_grad, grad_scale);
      if (s + 1 < S && !model_.has_stage(s + 1))
        send(model_.stage_output(*sv), s + 1, false, pipeline_tag(layout_, M, false, s + 1, m));
      if (!with_grad) {  // the input is consumed; the output is consumed or sent
        if (s > 0 && model_.has_stage(s - 1)) saved.erase(key(s - 1, m));
        received.erase(k);
        if (s + 1 == S || !model_.has_stage(s + 1)) saved.erase(k);
      }
      continue;
    }
    Tensor grad_output;
    if (s + 1 < S) {
      if (model_.has_stage(s + 1)) {
        grad_output = model_.stage_input_grad(*saved.at(key(s + 1, m)));
      } else {
        Owned buf = empty(model_.stage_activation_shape(mb), model_.activation_dtype(), model_.params().device());
        recv(buf, s + 1, true, pipeline_tag(layout_, M, true, s, m));
        grad_output = buf;
        received[-1 - k] = std::move(buf);
      }
    }
    const bool last = last_backward.at(s) == i;
    model_.backward_stage(s, mb, *saved.at(k), grad_output, last ? grads_ready : Model::GradsReady{});
    if (s + 1 < S && model_.has_stage(s + 1)) saved.erase(key(s + 1, m));
    received.erase(-1 - k);
    received.erase(k);  // this stage's input, kept for its backward
    if (s > 0 && !model_.has_stage(s - 1)) {
      send(model_.stage_input_grad(*saved.at(k)), s - 1, true, pipeline_tag(layout_, M, true, s - 1, m));
      saved.erase(k);
    }
    if (s == 0) saved.erase(k);
  }
  if (pp_) {
    if (fwd_.empty()) {
      pp_->wait_sends();
    } else {
      for (auto& c : fwd_) c->wait_sends();
      for (auto& c : bwd_) c->wait_sends();
    }
  }
  pending_.clear();
  return loss;
}

}  // namespace engine
