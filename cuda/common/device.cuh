// The CUDA side of the device runtime: core/device.h's calls (allocation, copies, device query;
// defined in device.cu) and the compute stream. Plain C++ declarations so host .cpp files built
// by g++ can include this header. Every call checks its CUDA status and throws engine::Error.
#pragma once
#include "core/device.h"

namespace engine::cuda {

// The stream every launcher in cuda/ runs on (one compute stream per process; the comm layer
// adds its own and orders them with events). Opaque here so g++-built files can hold it.
using StreamHandle = void*;  // cudaStream_t
StreamHandle compute_stream();

}  // namespace engine::cuda
