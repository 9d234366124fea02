#include "train/plan.h"

#include <optional>

#include "checkpoint/tools.h"
#include "comm/launch.h"
#include "comm/nccl_comm.h"
#include "core/check.h"
#include "core/device.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "models/memory_estimate.h"
#include "ops/op.h"

namespace engine {

namespace {

// Refuses a run that cannot fit (models/memory_estimate.h) before anything is allocated: this
// rank's place in the layout as the mesh will give it (rank = (pp_rank x dp + dp_rank) x tp +
// tp_rank), its GPU's memory and the host's.
void check_run_memory(const Config& config, Device device, DType compute, const Comm& group, int gpu) {
  const DistributedConfig& d = config.distributed;
  const int n = group.size();
  const int64_t model_ranks = int64_t{d.tensor_parallel} * d.pipeline_parallel;
  if (model_ranks <= 0 || n % model_ranks != 0) return;  // the mesh names the problem
  RankPlacement p;
  p.tp = d.tensor_parallel;
  p.pp = d.pipeline_parallel;
  p.dp = static_cast<int>(n / model_ranks);
  p.pp_rank = group.rank() / (p.tp * p.dp);
  p.device = device;
  p.compute = compute;
  // Ranks of this host with a lower local rank share its memory (and every gpus-th one its GPU).
  const int local = launch_info().local_rank;
  std::vector<MemoryPool> pools;
  if (device == Device::CUDA) {
    const device::MemoryInfo info = device::memory_info();
    pools.push_back({true, static_cast<double>(info.free), static_cast<double>(info.total),
                     local / std::max(1, device::count()) + 1, str_cat("GPU ", gpu, " memory"),
                     "cudaMemGetInfo: free now; total"});
  }
  const HostMemory host = host_memory();
  pools.push_back({host.known, static_cast<double>(host.available), static_cast<double>(host.capacity), local + 1,
                   "host memory", host.source});
  // The teacher's folder is read again (and any problem with it named) when the trainer loads it.
  std::optional<ModelConfig> teacher;
  if (!config.distillation.teacher.empty()) try {
      teacher = checkpoint::folder_model_config(config.distillation.teacher);
    } catch (const Error&) {
    }
  check_memory(config, p, pools, group.rank(), teacher ? &*teacher : nullptr);
}

}  // namespace

Device resolve_device(DeviceChoice choice) {
  const int gpus = device::count();
  switch (choice) {
    case DeviceChoice::CPU: return Device::CPU;
    case DeviceChoice::CUDA:
      ENSURE(device::in_build(), "run.device = \"cuda\": this build has no CUDA support (built without nvcc)");
      ENSURE(gpus > 0, "run.device = \"cuda\": no CUDA device is visible");
      return Device::CUDA;
    case DeviceChoice::Auto: return gpus > 0 ? Device::CUDA : Device::CPU;
  }
  return Device::CPU;
}

std::string cuda_unsupported(const ModelConfig& m) {
  if (has_block_kind(m, "G") && (m.gdn_key_head_dim > 128 || m.gdn_value_head_dim > 128))
    return str_cat("the Gated DeltaNet (G) CUDA kernels take model.gdn_key_head_dim and model.gdn_value_head_dim up to "
                   "128, got ", m.gdn_key_head_dim, " and ", m.gdn_value_head_dim);
  if (has_block_kind(m, "S") && (m.mamba_head_dim > 128 || m.mamba_d_state > 128))
    return str_cat("the Mamba-2 (S) scan's CUDA kernels take model.mamba_head_dim and model.mamba_d_state up to 128, got ",
                   m.mamba_head_dim, " and ", m.mamba_d_state);
  return "";
}

RunPlan make_run_plan(const Config& config, Comm* group) {
  RunPlan plan;
  plan.device = resolve_device(config.run.device);
  if (plan.device == Device::CUDA) {
    const char* fix = ": this run would use the GPU; set run.device = \"cpu\"";
    if (const std::string why = cuda_unsupported(config.model); !why.empty()) RAISE(config.where("run.device"), why, fix);
    if (!config.distillation.teacher.empty()) {
      std::optional<ModelConfig> teacher;  // (an unreadable folder is named where the trainer loads it)
      try {
        teacher = checkpoint::folder_model_config(config.distillation.teacher);
      } catch (const Error&) {
      }
      if (const std::string why = teacher ? cuda_unsupported(*teacher) : ""; !why.empty())
        RAISE(config.where("distillation.teacher"), config.distillation.teacher, ": its ", why, fix);
    }
  }
  const int gpu = plan.device == Device::CUDA ? launch_info().local_rank % device::count() : 0;
  if (plan.device == Device::CUDA) device::select(gpu);
  plan.compute = plan.device == Device::CPU ? DType::F32 : DType::BF16;
  check_run_memory(config, plan.device, plan.compute, group ? *group : world(), gpu);
  if (!group && plan.device == Device::CUDA && world().size() > 1) plan.device_comm = make_nccl_comm(world());
  plan.mesh = std::make_unique<Mesh>(group ? *group : plan.device_comm ? *plan.device_comm : world(), config);
  if (plan.device == Device::CUDA)
    log_info("GPU ", gpu, ": ", device::description(gpu), ", data-parallel backend ", plan.mesh->dp().backend());
  // The kernels every op's Auto choice takes on this device, from its capability and the code
  // this binary has for it (ops/op.h): fixed for the run from here on.
  if (plan.device == Device::CUDA) log_info(ops::kernel_choices(plan.device));
  const DistributedConfig& dist = config.distributed;
  const Mesh& m = *plan.mesh;
  plan.layout = ModelLayout{m.tp(),       dist.sequence_parallel, resolved_cross_entropy_splits(config), m.pp_rank(),
                            m.pp_size(), dist.stages_per_rank,  config.training.recompute_activations,
                            dist.tp_overlap,
                            config.training.fp8,
                            // equal, aligned shards over the dp ranks
                            64 * int64_t{m.dp().size()}};
  plan.bucket_elements = static_cast<int64_t>(dist.reduce_bucket_mb * (1 << 20) / 4);
  return plan;
}

ModelParallelGroups RunPlan::parallel_groups(const Model& model) {
  ModelParallelGroups groups;
  groups.tp = mesh->tp();
  groups.sequence_parallel = layout.sequence_parallel;
  groups.pp = mesh->pp();
  const int last_rank = (layout.stages() - 1) % layout.pipeline_size;
  const std::vector<std::string> tied = model.tied_parameters();
  if (!tied.empty() && last_rank != 0) {
    // The first and the last stage's ranks each hold a copy: their gradients are summed.
    Comm& pp = *mesh->pp();
    const bool holder = pp.rank() == 0 || pp.rank() == last_rank;
    tied_group = pp.split(holder ? 0 : 1 + pp.rank(), pp.rank());
    if (holder) {
      groups.tied = tied_group.get();
      groups.tied_params = tied;
      groups.count_tied = pp.rank() == 0;
    }
  }
  return groups;
}

}  // namespace engine
