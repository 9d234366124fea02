#include "core/buffer.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/checked.h"
#include "core/device.h"

namespace engine {
namespace {

// No host or device holds this much; a larger request is a size computed wrongly (or from a value
// too large to be meant), refused before the size-class arithmetic below could wrap.
constexpr size_t kMaxAllocation = size_t{1} << 56;  // 64 PiB

// Size classes: multiples of 512 bytes up to 1 MiB, then multiples of 1/8 of the power of two
// at or below the size (at most 12.5% waste). Exact re-use of a class keeps the cache simple and
// deterministic.
size_t size_class(size_t bytes, Device device) {
  if (bytes == 0) return 0;
  if (bytes > kMaxAllocation)
    RAISE("allocation of ", bytes, " bytes of ", device_name(device), " memory: more than any ",
          device == Device::CPU ? "host" : "device", " holds (", kMaxAllocation, " bytes at most)");
  if (bytes <= (1u << 20)) return (bytes + 511) / 512 * 512;
  size_t p = 1;
  while (p * 2 <= bytes) p *= 2;
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

struct CachingAllocator {
  Device device;
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;
  MemoryStats stats;

  void* system_alloc(size_t bytes) {
    void* p = nullptr;
    if (device == Device::CPU) {
      p = std::aligned_alloc(256, bytes);
      if (!p)
        RAISE("out of host memory allocating ", bytes, " bytes (", stats.in_use, " bytes in use and ",
              stats.reserved, " reserved by this process's allocator)");
    } else {
      try {
        p = device::alloc(bytes);
      } catch (const Error& e) {
        throw Error(str_cat(e.what(), " (", stats.in_use, " bytes in use and ", stats.reserved,
                            " reserved by this process's allocator)"));
      }
    }
    stats.system_allocs++;
    return p;
  }
  void system_free(void* p) {
    if (device == Device::CPU) {
      std::free(p);
    } else {
      device::release(p);
    }
  }

  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu);
    void* p = nullptr;
    auto it = free_blocks.find(cls);
    if (it != free_blocks.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      p = system_alloc(cls);
      stats.reserved += cls;
      if (stats.reserved > stats.peak_reserved) stats.peak_reserved = stats.reserved;
    }
    stats.in_use += cls;
    if (stats.in_use > stats.peak_in_use) stats.peak_in_use = stats.in_use;
    return p;
  }
  void give(void* p, size_t cls) {
    std::lock_guard<std::mutex> lock(mu);
    free_blocks[cls].push_back(p);
    stats.in_use -= cls;
  }
  void release_cached() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [cls, blocks] : free_blocks) {
      for (void* p : blocks) system_free(p);
      stats.reserved -= cls * blocks.size();
    }
    free_blocks.clear();
  }
};

CachingAllocator& allocator(Device d) {
  // Leaked on purpose: buffers may outlive static destruction order at exit.
  static CachingAllocator* cpu = new CachingAllocator{Device::CPU, {}, {}, {}};
  static CachingAllocator* gpu = new CachingAllocator{Device::CUDA, {}, {}, {}};
  return d == Device::CPU ? *cpu : *gpu;
}

}  // namespace

Buffer::Buffer(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  capacity_ = size_class(bytes, device);
  if (capacity_) ptr_ = allocator(device).take(capacity_);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    capacity_ = o.capacity_;
    device_ = o.device_;
    o.ptr_ = nullptr;
    o.bytes_ = o.capacity_ = 0;
  }
  return *this;
}

void Buffer::release() {
  if (ptr_) allocator(device_).give(ptr_, capacity_);
  ptr_ = nullptr;
  bytes_ = capacity_ = 0;
}

Owned empty(Shape s, DType dtype, Device device) {
  Owned o;
  o.buf = Buffer(checked_mul<size_t>(static_cast<size_t>(s.numel()), dtype_size(dtype), "bytes of a ",
                                     dtype_name(dtype), " tensor of shape ", s.str()),
                 device);
  o.t = Tensor(o.buf.data(), dtype, device, s);
  return o;
}

Owned zeros(Shape s, DType dtype, Device device) {
  Owned o = empty(s, dtype, device);
  zero_tensor(o.t);
  return o;
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev == Device::CPU && src_dev == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  device::copy(dst, dst_dev == Device::CUDA, src, src_dev == Device::CUDA, bytes);
}

void upload_bytes(void* dst, Device dst_dev, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  device::upload(dst, src, bytes);
}

void fill_zero_bytes(void* dst, Device dev, size_t bytes) {
  if (bytes == 0) return;
  if (dev == Device::CPU) {
    std::memset(dst, 0, bytes);
    return;
  }
  device::zero(dst, bytes);
}

void copy_tensor(const Tensor& dst, const Tensor& src) {
  ENSURE(dst.dtype == src.dtype, "copy ", dtype_name(src.dtype), " into ", dtype_name(dst.dtype));
  ENSURE_EQ(dst.numel(), src.numel(), "copy ", src.shape.str(), " into ", dst.shape.str());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.nbytes());
}

void zero_tensor(const Tensor& t) { fill_zero_bytes(t.data, t.device, t.nbytes()); }

MemoryStats memory_stats(Device device) {
  auto& a = allocator(device);
  std::lock_guard<std::mutex> lock(a.mu);
  return a.stats;
}

void reset_peak_memory(Device device) {
  auto& a = allocator(device);
  std::lock_guard<std::mutex> lock(a.mu);
  a.stats.peak_in_use = a.stats.in_use;
  a.stats.peak_reserved = a.stats.reserved;
}

void release_cached_memory(Device device) { allocator(device).release_cached(); }

}  // namespace engine
