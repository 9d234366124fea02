// Host-side entry points of the CUDA runtime that core/ needs (allocation, copies, device
// query). Plain C++ declarations so host .cpp files built by g++ can include this header; the
// implementation is device.cu. Every call checks its CUDA status and throws engine::Error.
#pragma once
#include <cstddef>
#include <string>

namespace engine::cuda {

int device_count();                  // 0 when no driver or no GPU (never throws)
std::string device_description(int device);
void set_device(int device);
void* device_alloc(size_t bytes);
void device_free(void* p);
void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes);
// Host -> device through pinned staging, on the compute stream, without waiting (core/buffer.h).
void upload_bytes(void* dst, const void* src, size_t bytes);
void zero_bytes(void* dst, size_t bytes);

}  // namespace engine::cuda

namespace engine::cuda {

// The stream every launcher in cuda/ runs on (one compute stream per process; the comm layer
// will add its own and order them with events). Opaque here so g++-built files can hold it.
using StreamHandle = void*;  // cudaStream_t
StreamHandle compute_stream();

}  // namespace engine::cuda
