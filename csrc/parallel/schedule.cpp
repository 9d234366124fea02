#include "parallel/schedule.h"

#include <algorithm>

#include "core/check.h"

namespace engine {
namespace {

// 1f1b (schedule.h) over M micro-batches of C chunks; with k stages per rank, the interleaved
// form (M a multiple of the P ranks).
std::vector<PipelineStep> one_f_one_b(const PipelineLayout& layout, int M, int C) {
  const int S = layout.stages, P = layout.ranks, k = S / P;
  ENSURE(k == 1 || M % P == 0, "the interleaved 1f1b schedule (", k, " stages per rank) needs the micro-batches (",
         M, ") in whole groups of the ", P, " pipeline ranks");
  // Each rank's own order over its k stages ("virtual steps" i = 0 .. M k - 1, a micro-batch on
  // one of its stages): forwards take the micro-batches in groups of P, a group through the
  // rank's first stage, then its second, ...; backwards the same groups through the stages in
  // reverse. A step is a whole micro-batch: its chunks' forwards in order, or their backwards in
  // reverse.
  const int total = M * k;
  std::vector<std::vector<PipelineStep>> local(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    auto& l = local[static_cast<size_t>(r)];
    auto step = [&](int i, bool backward) {
      const int group = i / (P * k), in = i % (P * k);
      const int nth = backward ? k - 1 - in / P : in / P;  // which of the rank's stages
      const int s = nth * P + r, m = group * P + in % P;
      if (backward) {
        for (int c = C; c-- > 0;) l.push_back({true, s, m * C + c});
      } else {
        for (int c = 0; c < C; ++c) l.push_back({false, s, m * C + c});
      }
    };
    // (With M == P and k > 1, Megatron-LM runs every forward first on every rank; here the
    // warm-up formula caps at M k only where it reaches it, so later ranks alternate sooner:
    // also a valid order, holding fewer activations.)
    const int warmup = k == 1 ? std::min(P - 1 - r, M) : std::min((P - 1 - r) * 2 + (k - 1) * P, total);
    int f = 0, b = 0;
    while (f < warmup) step(f++, false);
    while (f < total) {
      step(f++, false);
      step(b++, true);
    }
    while (b < total) step(b++, true);
  }
  // One global order: in turn, each rank takes its next step once the input it receives from the
  // neighbouring stage (the previous stage's forward, the next stage's backward) is placed. A
  // placed step never makes another unready, so this finds an order whenever one exists.
  const int U = M * C;
  std::vector<char> placed(static_cast<size_t>(2 * S * U), 0);
  auto at = [&](bool backward, int s, int u) -> char& {
    return placed[static_cast<size_t>(((backward ? S : 0) + s) * U + u)];
  };
  std::vector<PipelineStep> out;
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  while (out.size() < static_cast<size_t>(2 * S * U)) {
    bool moved = false;
    for (int r = 0; r < P; ++r) {
      const auto& l = local[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      if (i == l.size()) continue;
      const PipelineStep& st = l[i];
      const int s = st.stage;
      const bool ready = st.backward ? (s + 1 == S || at(true, s + 1, st.micro_batch))
                                     : (s == 0 || at(false, s - 1, st.micro_batch));
      if (!ready) continue;
      // What the rank's own order guarantees: a backward after its forward, a chunk's forward
      // after the previous chunk's and its backward after the next chunk's.
      const int c = st.micro_batch % C;
      ENSURE(!st.backward || at(false, s, st.micro_batch), "internal error: 1f1b backward before forward");
      ENSURE(st.backward ? (c + 1 == C || at(true, s, st.micro_batch + 1)) : (c == 0 || at(false, s, st.micro_batch - 1)),
             "internal error: 1f1b chunks out of order");
      at(st.backward, s, st.micro_batch) = 1;
      out.push_back(st);
      ++i;
      moved = true;
    }
    ENSURE(moved, "internal error: the 1f1b schedule of ", S, " stages over ", P, " ranks and ", M,
           " micro-batches is stuck");
  }
  return out;
}

}  // namespace

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
  if (kind == ScheduleKind::OneFOneB && with_grad) return one_f_one_b(layout, M, C);
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
