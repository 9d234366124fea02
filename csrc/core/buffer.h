// Owning memory. Buffer is a move-only handle on bytes of one device, taken from a per-device
// caching allocator: a freed block goes back to a free list keyed by its rounded size and is
// handed out again, so after the first training step (which sees every size the step needs) no
// call reaches malloc/cudaMalloc any more. memory_stats() reports the peak for the logs.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace engine {

class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device);  // uninitialised
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = static_cast<Buffer&&>(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  void release();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;     // as asked for
  size_t capacity_ = 0;  // as allocated (rounded size class)
  Device device_ = Device::CPU;
};

// A tensor together with the buffer that owns it; converts to the view.
struct Owned {
  Buffer buf;
  Tensor t;
  operator const Tensor&() const { return t; }
  const Tensor* operator->() const { return &t; }
  template <typename T> T* ptr() const { return t.ptr<T>(); }
};

Owned empty(Shape s, DType dtype, Device device);
Owned zeros(Shape s, DType dtype, Device device);

// Byte copies and fills between any two devices (host <-> device transfers go through these).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
// Host bytes to dst without waiting for the device: the bytes are copied into pinned staging
// memory at once (src may be freed on return) and reach a CUDA dst in compute-stream order,
// behind the work already queued; so the host keeps running ahead of the GPU (copy_bytes from
// host memory drains the stream first). A CPU dst is a plain memcpy.
void upload_bytes(void* dst, Device dst_dev, const void* src, size_t bytes);
void fill_zero_bytes(void* dst, Device dev, size_t bytes);
// Whole-tensor copy; shapes must have the same element count and the dtypes must match.
void copy_tensor(const Tensor& dst, const Tensor& src);
void zero_tensor(const Tensor& t);

struct MemoryStats {
  size_t in_use = 0;        // bytes handed out and not yet returned
  size_t peak_in_use = 0;   // high-water mark of in_use
  size_t reserved = 0;      // bytes held from the system (in use + cached)
  size_t peak_reserved = 0;
  uint64_t system_allocs = 0;  // calls that reached malloc/cudaMalloc
};
MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
// Returns cached blocks to the system (for tests and between runs in one process).
void release_cached_memory(Device device);

}  // namespace engine
