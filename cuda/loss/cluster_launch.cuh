// Host helpers of the loss kernels' Cluster paths (cross_entropy.cu, distillation.cu): the
// dynamic shared memory a block may take, the launch configuration of a thread-block cluster,
// and whether the device can schedule a cluster shape. nvcc only.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>
#include <map>
#include <mutex>
#include <tuple>

#include "cuda/common/check.cuh"

namespace engine::cuda::cluster_launch {

// The largest dynamic shared memory every one of `kernels` can take per block (the device's
// opt-in limit less each kernel's static shared memory), capped at `cap` and rounded down to a
// multiple of `align`; raises each kernel's limit to it and prefers shared memory in the
// L1/shared carveout. Call once per kernel family (the callers cache the result).
inline int64_t raise_dynamic_smem(const std::vector<const void*>& kernels, int64_t cap, int64_t align) {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int64_t limit = optin;
  for (const void* k : kernels) {
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, k));
    limit = std::min<int64_t>(limit, optin - static_cast<int64_t>(attr.sharedSizeBytes));
  }
  limit = std::min<int64_t>(limit, cap) / align * align;
  for (const void* k : kernels) {
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(limit)));
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  }
  return limit;
}

// `blocks` blocks of `threads` threads in clusters of `cluster` along x, `smem` dynamic shared
// memory each; `attr` holds the cluster attribute and must outlive the launch.
inline cudaLaunchConfig_t config(int64_t blocks, int threads, int cluster, int64_t smem, cudaStream_t stream,
                                 cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(cluster);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Whether the device can run at least one cluster of this shape of `kernel` (cached). The
// kernel's dynamic shared-memory limit must already be raised (raise_dynamic_smem).
inline bool schedulable(const void* kernel, int threads, int cluster, int64_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int64_t>, bool> known;
  const auto key = std::make_tuple(kernel, cluster, smem);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(key); it != known.end()) return it->second;
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = config(cluster, threads, cluster, smem, nullptr, &attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();  // not sticky: an unsupported shape is a "no"
    n = 0;
  }
  return known[key] = n > 0;
}

}  // namespace engine::cuda::cluster_launch
