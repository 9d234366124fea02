#include "parallel/schedule.h"

#include "core/check.h"

namespace engine {

std::vector<PipelineStep> build_schedule(const PipelineLayout& layout, int units, ScheduleKind kind, bool with_grad,
                                         int chunks) {
  const int S = layout.stages, U = units, C = chunks;
  ENSURE(S >= 1 && U >= 0 && layout.ranks >= 1 && S % layout.ranks == 0, "pipeline of ", S, " stages over ",
         layout.ranks, " ranks with ", U, " micro-batches");
  ENSURE(C >= 1 && U % C == 0, U, " schedule units are not whole micro-batches of ", C, " chunks");
  const int M = U / C;
  std::vector<PipelineStep> out;
  if (kind == ScheduleKind::DepthFirst) {
    for (int m = 0; m < M; ++m) {
      for (int c = 0; c < C; ++c)
        for (int s = 0; s < S; ++s) out.push_back({false, s, m * C + c});
      if (with_grad)
        for (int c = C; c-- > 0;)
          for (int s = S; s-- > 0;) out.push_back({true, s, m * C + c});
    }
    return out;
  }
  for (int s = 0; s < S; ++s)
    for (int u = 0; u < U; ++u) out.push_back({false, s, u});
  if (with_grad)
    for (int s = S; s-- > 0;)
      for (int m = 0; m < M; ++m)
        for (int c = C; c-- > 0;) out.push_back({true, s, m * C + c});
  return out;
}

std::vector<PipelineStep> steps_of_rank(const std::vector<PipelineStep>& schedule, const PipelineLayout& layout,
                                        int rank) {
  std::vector<PipelineStep> out;
  for (const PipelineStep& st : schedule)
    if (layout.rank_of(st.stage) == rank) out.push_back(st);
  return out;
}

int pipeline_tag(const PipelineLayout& layout, int micro_batches, bool backward, int stage, int micro_batch) {
  return ((backward ? layout.stages : 0) + stage) * micro_batches + micro_batch;
}

std::string describe_schedule(const std::vector<PipelineStep>& schedule, const PipelineLayout& layout,
                              int chunks) {
  std::string out;
  for (int r = 0; r < layout.ranks; ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (const PipelineStep& st : steps_of_rank(schedule, layout, r)) {
      if (chunks > 1)
        out += str_cat(" ", st.backward ? "B" : "F", st.stage, ".", st.micro_batch / chunks, ":",
                       st.micro_batch % chunks);
      else
        out += str_cat(" ", st.backward ? "B" : "F", st.stage, ".", st.micro_batch);
      // The input of this step from another rank: the previous stage's output (forward) or the
      // next stage's input gradient (backward).
      const int from = st.backward ? st.stage + 1 : st.stage - 1;
      if (from >= 0 && from < layout.stages && layout.rank_of(from) != r) out += str_cat("<r", layout.rank_of(from));
    }
    out += "\n";
  }
  return out;
}

}  // namespace engine
