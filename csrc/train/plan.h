// The plan of a run, made once from its config before any model exists: the device (selected for
// this rank), the compute dtype, the communicators (the run's group, NCCL over it on GPUs, and
// the mesh of data-, tensor- and pipeline-parallel groups of parallel/mesh.h), the model layout
// (the tensor- and pipeline-parallel split, recomputation, the flat buffers' padding for even
// ZeRO shards) and the gradient bucket size. The trainer builds the model, the pipeline and
// DataParallel from it; it names no device API and no layer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "comm/comm.h"
#include "config/config.h"
#include "models/model.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"

namespace engine {

// run.device: auto picks the GPU when this build has CUDA and a GPU is visible, else the CPU.
Device resolve_device(DeviceChoice choice);

struct RunPlan {
  Device device = Device::CPU;
  DType compute = DType::F32;           // parameters and activations: bf16 on GPUs, f32 on the CPU
  std::unique_ptr<Comm> device_comm;    // NCCL over the world on GPUs with several ranks
  std::unique_ptr<Mesh> mesh;
  ModelLayout layout;
  int64_t bucket_elements = 0;          // gradient reduction / weight gather bucket (f32 elements)
  std::unique_ptr<Comm> tied_group;     // set by parallel_groups where a tied copy spans stages

  // The groups the model's gradients are summed over besides data parallelism: the
  // tensor-parallel group (replicated parameters) and, where the model ties parameters across
  // its first and last stage (Model::tied_parameters), the group of the two ranks holding them.
  ModelParallelGroups parallel_groups(const Model& model);
};

// Why the CUDA kernels cannot run a model (empty when they can): Gated DeltaNet (G) blocks have
// none yet; the Mamba-2 (S) scan takes head dims and state counts up to 128. Names the keys.
std::string cuda_unsupported(const ModelConfig& m);

// group: every rank of the run (world() when nullptr). Selects this rank's GPU (its local rank)
// before anything touches one, and logs it.
RunPlan make_run_plan(const Config& config, Comm* group);

}  // namespace engine
