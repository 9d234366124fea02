// Pipeline schedules: the order in which a batch's micro-batches run through the stages.
// The model's layers are split into S = pipeline_parallel x stages_per_rank consecutive stages
// (stage 0 holds the embedding, stage S - 1 the head); stage s runs on pipeline rank s % pp, so
// with several stages per rank they interleave around the ring of ranks.
// A schedule is one global list of steps, each a forward or backward of one (stage, micro-batch),
// in an order that respects their dependencies; every rank runs the steps of its stages in that
// order. Activations (forward) and their gradients (backward) go from rank to rank as
// non-blocking sends and blocking receives, so by induction on the global order no rank can wait
// forever: the producer of anything a rank waits for is earlier in the order and never blocks on
// a send.
//   depth_first    micro-batch after micro-batch: F(0..S-1, m) then B(S-1..0, m), then m + 1
//                  (gradient accumulation; one micro-batch's activations alive at a time, the
//                  other ranks idle while one works)
//   breadth_first  stage after stage: F(s, 0..M-1) for s = 0..S-1, then B(s, 0..M-1) for
//                  s = S-1..0, so rank r works on micro-batch m + 1 of its stage while rank r + 1
//                  takes micro-batch m: the pipeline fills (bubble (pp - 1) / (M + pp - 1) of the
//                  time with one stage per rank) at the cost of keeping every micro-batch's
//                  activations until its backward
//   1f1b           one forward, one backward. One stage per rank: rank r first runs the forwards
//                  of min(P - 1 - r, M) micro-batches, then alternates the next forward with the
//                  oldest backward, then runs the backwards left; the bubble is breadth_first's,
//                  but rank r holds the activations of at most P - r micro-batches, not M.
//                  Interleaved (k stages per rank, M a multiple of P; Megatron-LM's schedule):
//                  a rank's forwards take the micro-batches in groups of P through its first
//                  stage, then its second, ..., its backwards the same groups through its stages
//                  in reverse, after min(M k, (P - 1 - r) 2 + (k - 1) P) warm-up forwards (with
//                  M == P Megatron-LM warms up fully on every rank; here only where the formula
//                  reaches M k); by Megatron-LM's analysis the bubble shrinks k times against one
//                  stage per rank, and rank r holds up to warm-up + 1 (stage, micro-batch)
//                  activations of 1/k of its layers. The global order interleaves the ranks'
//                  orders, each step after its input from the neighbouring stage; on each link
//                  the messages go in one order on both sides, as NCCL needs (tested).
// Micro-sequences: each micro-batch runs as `chunks` consecutive token chunks (see
// models/micro_batch.h); the schedule's units are (micro-batch, chunk) pairs, numbered
// u = m * chunks + c. A chunk's forward on a stage needs the previous chunk's forward on that
// stage (its keys and values) and a chunk's backward the next chunk's backward on that stage
// (the gradients of its keys and values), so chunks run forward in order and backward in
// reverse: depth_first runs F(all stages) of chunks 0..C-1, then B(all stages) of chunks C-1..0;
// breadth_first keeps its stage order with the units of each micro-batch reversed in backward;
// 1f1b alternates whole micro-batches: all chunks' forwards, or all chunks' backwards in reverse.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"

namespace engine {

struct PipelineStep {
  bool backward = false;
  int stage = 0;
  int micro_batch = 0;  // the unit: micro-batch * chunks + chunk
};

struct PipelineLayout {
  int stages = 1;        // S
  int ranks = 1;         // pipeline_parallel
  int rank_of(int stage) const { return stage % ranks; }
};

// The global order of the steps of one batch of `units` = micro-batches x chunks (forwards only
// without gradients: 1f1b then runs breadth_first's forwards); chunks divides units; the
// interleaved 1f1b needs the micro-batches (units / chunks) in whole groups of the ranks.
std::vector<PipelineStep> build_schedule(const PipelineLayout& layout, int units, ScheduleKind kind, bool with_grad,
                                         int chunks = 1);
// The steps of one pipeline rank, in order.
std::vector<PipelineStep> steps_of_rank(const std::vector<PipelineStep>& schedule, const PipelineLayout& layout,
                                        int rank);
// A message tag unique within a batch: (direction, stage that receives, micro-batch).
int pipeline_tag(const PipelineLayout& layout, int micro_batches, bool backward, int stage, int micro_batch);
// One line per rank: "rank 0: F0.0 F0.1 ... B0.1 B0.0" (F/B, stage.micro_batch; with chunks > 1
// stage.micro_batch:chunk), with where each step's input comes from when another rank sends it
// ("<r1").
std::string describe_schedule(const std::vector<PipelineStep>& schedule, const PipelineLayout& layout,
                              int chunks = 1);

}  // namespace engine
