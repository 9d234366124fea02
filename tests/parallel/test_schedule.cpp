// Pipeline schedules (parallel/schedule.h): the documented orders, every step's inputs produced
// earlier in the global order (what makes the non-blocking-send execution deadlock free), each
// step on exactly one rank, unique message tags, and the printed form.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "parallel/schedule.h"

using namespace engine;

namespace {
std::string names(const std::vector<PipelineStep>& steps) {
  std::string s;
  for (const PipelineStep& st : steps)
    s += (s.empty() ? "" : " ") + std::string(st.backward ? "B" : "F") + std::to_string(st.stage) + "." +
         std::to_string(st.micro_batch);
  return s;
}
}  // namespace

TEST_CASE("pipeline schedules: depth-first and breadth-first orders") {
  const PipelineLayout l{2, 1};
  CHECK(names(build_schedule(l, 2, ScheduleKind::DepthFirst, true)) == "F0.0 F1.0 B1.0 B0.0 F0.1 F1.1 B1.1 B0.1");
  CHECK(names(build_schedule(l, 2, ScheduleKind::BreadthFirst, true)) == "F0.0 F0.1 F1.0 F1.1 B1.0 B1.1 B0.0 B0.1");
  CHECK(names(build_schedule(l, 2, ScheduleKind::BreadthFirst, false)) == "F0.0 F0.1 F1.0 F1.1");
  const PipelineLayout il{4, 2};  // 2 stages per rank, interleaved
  const auto s = build_schedule(il, 2, ScheduleKind::BreadthFirst, true);
  CHECK(names(steps_of_rank(s, il, 0)) == "F0.0 F0.1 F2.0 F2.1 B2.0 B2.1 B0.0 B0.1");
  CHECK(names(steps_of_rank(s, il, 1)) == "F1.0 F1.1 F3.0 F3.1 B3.0 B3.1 B1.0 B1.1");
  CHECK(describe_schedule(s, il) ==
        "rank 0: F0.0 F0.1 F2.0<r1 F2.1<r1 B2.0<r1 B2.1<r1 B0.0<r1 B0.1<r1\n"
        "rank 1: F1.0<r0 F1.1<r0 F3.0<r0 F3.1<r0 B3.0 B3.1 B1.0<r0 B1.1<r0\n");
}

TEST_CASE("pipeline schedules with micro-sequences: chunks forward in order, backward in reverse") {
  const PipelineLayout l{2, 1};
  // 2 micro-batches of 2 chunks: units 0, 1 (micro-batch 0) and 2, 3 (micro-batch 1).
  CHECK(names(build_schedule(l, 4, ScheduleKind::DepthFirst, true, 2)) ==
        "F0.0 F1.0 F0.1 F1.1 B1.1 B0.1 B1.0 B0.0 F0.2 F1.2 F0.3 F1.3 B1.3 B0.3 B1.2 B0.2");
  CHECK(names(build_schedule(l, 4, ScheduleKind::BreadthFirst, true, 2)) ==
        "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 B1.1 B1.0 B1.3 B1.2 B0.1 B0.0 B0.3 B0.2");
  const PipelineLayout pl{2, 2};
  CHECK(describe_schedule(build_schedule(pl, 2, ScheduleKind::DepthFirst, true, 2), pl, 2) ==
        "rank 0: F0.0:0 F0.0:1 B0.0:1<r1 B0.0:0<r1\n"
        "rank 1: F1.0:0<r0 F1.0:1<r0 B1.0:1 B1.0:0\n");
  CHECK_THROWS_WITH(build_schedule(l, 3, ScheduleKind::DepthFirst, true, 2), doctest::Contains("whole micro-batches"));
}

TEST_CASE("pipeline schedules: 1f1b warms up, alternates, drains; at most P - r micro-batches in flight") {
  const PipelineLayout l{2, 2};
  const auto s = build_schedule(l, 3, ScheduleKind::OneFOneB, true);
  CHECK(names(steps_of_rank(s, l, 0)) == "F0.0 F0.1 B0.0 F0.2 B0.1 B0.2");
  CHECK(names(steps_of_rank(s, l, 1)) == "F1.0 B1.0 F1.1 B1.1 F1.2 B1.2");
  CHECK(names(s) == "F0.0 F1.0 F0.1 B1.0 B0.0 F1.1 F0.2 B1.1 B0.1 F1.2 B1.2 B0.2");
  const PipelineLayout l4{4, 4};
  const auto s4 = build_schedule(l4, 6, ScheduleKind::OneFOneB, true);
  CHECK(names(steps_of_rank(s4, l4, 0)) == "F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 B0.3 B0.4 B0.5");
  CHECK(names(steps_of_rank(s4, l4, 2)) == "F2.0 F2.1 B2.0 F2.2 B2.1 F2.3 B2.2 F2.4 B2.3 F2.5 B2.4 B2.5");
  // Fewer micro-batches than stages: the warm-up takes them all.
  CHECK(names(steps_of_rank(build_schedule(l4, 2, ScheduleKind::OneFOneB, true), l4, 0)) == "F0.0 F0.1 B0.0 B0.1");
  // Micro-sequences: whole micro-batches alternate (2 micro-batches of 2 chunks).
  CHECK(names(steps_of_rank(build_schedule(l, 4, ScheduleKind::OneFOneB, true, 2), l, 0)) ==
        "F0.0 F0.1 F0.2 F0.3 B0.1 B0.0 B0.3 B0.2");
  CHECK(names(steps_of_rank(build_schedule(l, 4, ScheduleKind::OneFOneB, true, 2), l, 1)) ==
        "F1.0 F1.1 B1.1 B1.0 F1.2 F1.3 B1.3 B1.2");
  // Forwards only: breadth_first's order.
  CHECK(names(build_schedule(l, 2, ScheduleKind::OneFOneB, false)) == "F0.0 F0.1 F1.0 F1.1");
  // Interleaved (2 stages per rank, 4 micro-batches in groups of 2): rank 0 holds stages 0 and 2.
  const PipelineLayout il{4, 2};
  const auto si = build_schedule(il, 4, ScheduleKind::OneFOneB, true);
  CHECK(names(steps_of_rank(si, il, 0)) ==
        "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3");
  CHECK(names(steps_of_rank(si, il, 1)) ==
        "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3");
  CHECK_THROWS_WITH(build_schedule(il, 3, ScheduleKind::OneFOneB, true), doctest::Contains("whole groups"));
  // The memory bound: micro-batches forwarded and not yet backwarded on rank r stay <= S - r.
  for (int S : {1, 2, 3, 4, 5})
    for (int M : {1, 2, 3, 7, 12})
      for (int chunks : {1, 3}) {
        const PipelineLayout pl{S, S};
        const auto sc = build_schedule(pl, M * chunks, ScheduleKind::OneFOneB, true, chunks);
        for (int r = 0; r < S; ++r) {
          int in_flight = 0, most = 0;
          for (const PipelineStep& st : steps_of_rank(sc, pl, r)) {
            const int c = st.micro_batch % chunks;
            if (!st.backward && c == 0) most = std::max(most, ++in_flight);
            if (st.backward && c == 0) --in_flight;
          }
          CAPTURE(S);
          CAPTURE(M);
          CAPTURE(r);
          CHECK(most == std::min(S - r, M));
          CHECK(in_flight == 0);
        }
      }
  // Interleaved: (stage, micro-batch) pairs forwarded and not yet backwarded on rank r stay at
  // most its warm-up plus one, min(M k, 2 (P - 1 - r) + (k - 1) P + 1).
  for (int P : {2, 3, 4})
    for (int k : {2, 3})
      for (int groups : {1, 2, 3}) {
        const int M = groups * P;
        const PipelineLayout pl{P * k, P};
        const auto sc = build_schedule(pl, M, ScheduleKind::OneFOneB, true);
        for (int r = 0; r < P; ++r) {
          int in_flight = 0, most = 0;
          for (const PipelineStep& st : steps_of_rank(sc, pl, r)) most = std::max(most, in_flight += st.backward ? -1 : 1);
          CAPTURE(P);
          CAPTURE(k);
          CAPTURE(M);
          CAPTURE(r);
          CHECK(most == std::min(M * k, 2 * (P - 1 - r) + (k - 1) * P + 1));
          CHECK(in_flight == 0);
        }
      }
}

TEST_CASE("pipeline schedules: inputs come earlier, each step once, unique tags") {
  for (ScheduleKind kind : {ScheduleKind::BreadthFirst, ScheduleKind::DepthFirst, ScheduleKind::OneFOneB})
    for (int ranks : {1, 2, 3, 4})
      for (int per_rank : {1, 2, 3})
        for (int chunks : {1, 2, 3})
        for (int mbs : {1, 2, 3, 4, 5, 12}) {
          // interleaved 1f1b: micro-batches in whole groups of the ranks
          if (kind == ScheduleKind::OneFOneB && per_rank > 1 && mbs % ranks != 0) continue;
          const int M = mbs * chunks;
          const PipelineLayout l{ranks * per_rank, ranks};
          const auto s = build_schedule(l, M, kind, true, chunks);
          CAPTURE(names(s));
          REQUIRE(s.size() == static_cast<size_t>(2 * l.stages * M));
          std::set<std::tuple<bool, int, int>> done;
          std::set<int> tags;
          for (const PipelineStep& st : s) {
            // Forward (s, m) needs forward (s - 1, m); backward (s, m) needs forward (s, m) and
            // backward (s + 1, m).
            if (!st.backward && st.stage > 0) CHECK(done.count({false, st.stage - 1, st.micro_batch}));
            if (st.backward) {
              CHECK(done.count({false, st.stage, st.micro_batch}));
              if (st.stage + 1 < l.stages) CHECK(done.count({true, st.stage + 1, st.micro_batch}));
            }
            // Micro-sequences: a chunk's forward on a stage after the previous chunk's (its keys),
            // its backward after the next chunk's (the gradients of its keys).
            const int c = st.micro_batch % chunks;
            if (!st.backward && c > 0) CHECK(done.count({false, st.stage, st.micro_batch - 1}));
            if (st.backward && c + 1 < chunks) CHECK(done.count({true, st.stage, st.micro_batch + 1}));
            CHECK(done.insert({st.backward, st.stage, st.micro_batch}).second);
            CHECK(tags.insert(pipeline_tag(l, M, st.backward, st.stage, st.micro_batch)).second);
          }
          // Each link (rank x to rank y, one direction) carries its messages in one order on both
          // sides, as NCCL matches them by order: a stage's output is sent at its forward and
          // received at the next stage's forward, an input gradient sent at a stage's backward and
          // received at the previous stage's backward.
          for (bool backward : {false, true})
            for (int x = 0; x < ranks; ++x)
              for (int y = 0; y < ranks; ++y) {
                if (x == y) continue;
                std::vector<std::pair<int, int>> sent, got;  // (boundary, unit)
                for (const PipelineStep& st : s) {
                  if (st.backward != backward) continue;
                  const int to = backward ? st.stage - 1 : st.stage + 1, from = backward ? st.stage + 1 : st.stage - 1;
                  if (to >= 0 && to < l.stages && l.rank_of(st.stage) == x && l.rank_of(to) == y)
                    sent.push_back({std::min(st.stage, to), st.micro_batch});
                  if (from >= 0 && from < l.stages && l.rank_of(from) == x && l.rank_of(st.stage) == y)
                    got.push_back({std::min(st.stage, from), st.micro_batch});
                }
                CHECK(sent == got);
              }
          size_t total = 0;
          for (int r = 0; r < ranks; ++r) {
            for (const PipelineStep& st : steps_of_rank(s, l, r)) CHECK(l.rank_of(st.stage) == r);
            total += steps_of_rank(s, l, r).size();
          }
          CHECK(total == s.size());
        }
}
