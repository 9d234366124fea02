// The accelerator's runtime as the code below the kernels sees it: count and pick devices, and
// move bytes. core/ declares it and depends on nothing above itself; the CUDA backend defines
// it (cuda/common/device.cu), and a build without CUDA links csrc/core/no_device.cpp instead,
// whose count() is 0 and whose other calls raise engine::Error saying the build has no CUDA.
// Every call checks the runtime's status and throws engine::Error.
#pragma once
#include <cstddef>
#include <string>

namespace engine::device {

bool in_build();                  // whether this build has a device backend at all
int count();                      // 0 when no driver, no GPU or no CUDA in the build (never throws)
std::string description(int device);  // "NVIDIA H200 (sm_90, 139 GiB)"
void select(int device);          // this process's device from now on
struct MemoryInfo {
  size_t free = 0, total = 0;     // bytes
};
MemoryInfo memory_info();         // of the selected device, now (the run's memory check)
void* alloc(size_t bytes);
void release(void* p);
// Ordered with the kernels on the compute stream; a copy that touches host memory returns only
// when the bytes have arrived.
void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes);
// Host -> device through pinned staging, on the compute stream, without waiting (core/buffer.h).
void upload(void* dst, const void* src, size_t bytes);
void zero(void* dst, size_t bytes);

}  // namespace engine::device
