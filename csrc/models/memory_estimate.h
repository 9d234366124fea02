// The memory one rank of a run needs, estimated from the config and the rank's place in the
// layout before anything is built or allocated, and the check that refuses a run that cannot
// fit. Every figure is a double computed from the config's values (no size can wrap), and the
// parameter counts come from the layers' own declarations of one block of each kind (never a
// table of num_layers entries), so any config is estimated in microseconds.
//
// The estimate is a LOWER BOUND of the rank's peak: it counts only what is alive at once during
// a training step's backward:
//   parameters       this rank's parameters (its pipeline stages, its tensor-parallel blocks) in
//                    the compute dtype (ZeRO-3 gathers them in full for the step)
//   gradients        one f32 per parameter
//   optimizer state  the two f32 AdamW moments and, unless the f32 weights serve as it, the f32
//                    master copy, of this rank's shard (1 / data-parallel ranks from ZeRO stage 1)
//   activations      what the blocks keep for backward at micro_batch_size x sequence_length
//                    tokens (normed inputs, attention q/k/v and output, MLP / expert / Mamba
//                    inner tensors; only each block's output with recompute_activations), times
//                    the micro-batches the pipeline schedule keeps in flight on this rank
//   logits           one chunk of the LM head's logits (tokens / cross_entropy_splits x the rank's
//                    vocabulary columns; and a distillation teacher's logits)
//   teacher          a distillation teacher's weights in the compute dtype, on the ranks of the
//                    student's last stage (given its model config)
//   workspaces       (GPU) the GEMM library's workspace
//   sample plan      (host) the data samplers' start positions, one per sample of the run
// and leaves out everything smaller or harder to bound (the CUDA context, the communicators'
// buffers, transient buffers inside a layer and a teacher's forward, padding, the allocator's size
// classes). So a run
// it refuses cannot fit; one it accepts may still run out of memory later (the allocator's
// error then says how much was asked for and how much is in use).
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "core/dtype.h"

namespace engine {

// Where the rank sits (the run's layout over `world` ranks), as comm/mesh.h places it.
struct RankPlacement {
  int dp = 1, tp = 1, pp = 1, pp_rank = 0;
  Device device = Device::CPU;
  DType compute = DType::F32;  // parameters and activations
};

struct MemoryPart {
  std::string name;
  bool host = false;  // host memory whatever the device (else the device's; on the CPU the same)
  double bytes = 0;
  std::string detail;  // how it is made up, with the values of the keys that drive it
};

struct MemoryEstimate {
  std::vector<MemoryPart> parts;
  double device_bytes() const;  // the parts in the run device's memory (every part on the CPU)
  double host_bytes() const;    // the parts in host memory (every part on the CPU)
};

// Raises (naming the model keys) only when a parameter tensor's element count overflows 64 bits.
// teacher: distillation.teacher's model config (nullptr: none, or not readable yet).
MemoryEstimate estimate_memory(const Config& c, const RankPlacement& p, const ModelConfig* teacher = nullptr);

// What the run may use: the device's memory (GPU runs) and the host's. `sharing`: a lower bound of
// the ranks that share the pool (ranks of this host, ranks on this GPU); their estimates together
// must fit its capacity, and this rank's estimate what is available now.
struct MemoryPool {
  bool known = false;  // false: not checked
  double available = 0, capacity = 0;
  int sharing = 1;
  std::string name, source;  // "host memory", "GPU 0 memory"; where the figures come from
};

// Refuses the run (Error at Config::where of the key whose halving saves the most memory, with
// every part, its size and the keys behind it) when this rank's estimate exceeds a pool's
// available bytes, or `sharing` times the smallest estimate over the pipeline ranks exceeds its
// capacity. pools: [device, host] for a GPU run, [host] for a CPU run.
void check_memory(const Config& c, const RankPlacement& p, const std::vector<MemoryPool>& pools, int rank,
                  const ModelConfig* teacher = nullptr);

}  // namespace engine
