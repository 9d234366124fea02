// The capability layer (device side, .cu only): feature macros from the architecture of the
// compilation pass, so a kernel that needs a Hopper feature guards its body and still builds for
// every architecture (its body is then a trap: the host side, arch.h, never selects it there).
//   ENGINE_ARCH_SM90  __CUDA_ARCH__ >= 900: thread-block clusters (cooperative_groups::
//                     this_cluster, distributed shared memory), cp.async.bulk and TMA, mbarrier
//                     transaction counts, griddepcontrol (programmatic dependent launch)
//   ENGINE_SM90A      the sm_90a pass (compute_90a): wgmma, setmaxnreg
// ENGINE_CLUSTER_DIMS(x, y, z): __cluster_dims__ where clusters exist (and in the host pass),
// nothing elsewhere (nvcc refuses the attribute for older architectures).
// ENGINE_ARCH_UNAVAILABLE(): the body of a guarded kernel on the architectures without the
// feature: a trap, should a launcher ever run it there.
#pragma once
#include "cuda/common/arch.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ENGINE_ARCH_SM90 1
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ENGINE_SM90A 1
#endif

#if !defined(__CUDA_ARCH__) || defined(ENGINE_ARCH_SM90)
#define ENGINE_CLUSTER_DIMS(x, y, z) __cluster_dims__(x, y, z)
#else
#define ENGINE_CLUSTER_DIMS(x, y, z)
#endif

#ifdef __CUDA_ARCH__
#define ENGINE_ARCH_UNAVAILABLE() __trap()
#else
#define ENGINE_ARCH_UNAVAILABLE() ((void)0)
#endif
