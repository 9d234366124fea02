// Tensor: a non-owning, contiguous, row-major view {data, dtype, device, shape}. Ops take
// tensors and dispatch on the device; ownership lives in Buffer (core/buffer.h) or in the flat
// parameter buffers. Views are cheap to copy and never free anything.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>

#include "core/check.h"
#include "core/checked.h"
#include "core/dtype.h"

namespace engine {

struct Shape {
  static constexpr int kMaxDims = 5;
  std::array<int64_t, kMaxDims> d{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    ENSURE(dims.size() <= kMaxDims, "at most ", kMaxDims, " dimensions");
    for (int64_t v : dims) {
      ENSURE(v >= 0, "negative dimension ", v);
      d[ndim++] = v;
    }
  }
  int64_t operator[](int i) const { return d[i < 0 ? ndim + i : i]; }
  // The element count; a shape whose count does not fit int64 is an error, never a wrapped value.
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i)
      if (mul_overflows(n, d[i], &n)) [[unlikely]]
        RAISE("shape ", str(), ": the element count overflows 64-bit integers");
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + ")";
  }
};
inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  Shape shape;

  Tensor() = default;
  Tensor(void* p, DType t, Device dev, Shape s) : data(p), dtype(t), device(dev), shape(s) {}

  int64_t numel() const { return shape.numel(); }
  int ndim() const { return shape.ndim; }
  int64_t size(int i) const { return shape[i]; }
  size_t nbytes() const {
    return checked_mul<size_t>(static_cast<size_t>(numel()), dtype_size(dtype), "bytes of a ", dtype_name(dtype),
                               " tensor of shape ", shape.str());
  }
  bool defined() const { return data != nullptr || numel() == 0; }

  template <typename T> T* ptr() const {
    ENSURE(dtype_of<T>() == dtype, "tensor holds ", dtype_name(dtype), ", accessed as ",
           dtype_name(dtype_of<T>()));
    return static_cast<T*>(data);
  }
  // Same memory, another shape with the same number of elements.
  Tensor view(Shape s) const {
    ENSURE_EQ(s.numel(), numel(), "view ", shape.str(), " as ", s.str());
    return Tensor(data, dtype, device, s);
  }
  // Rows [begin, end) along dimension 0.
  Tensor slice(int64_t begin, int64_t end) const {
    ENSURE(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape[0], "slice [", begin, ", ",
           end, ") of ", shape.str());
    Shape s = shape;
    s.d[0] = end - begin;
    int64_t row = shape[0] ? numel() / shape[0] : 0;
    return Tensor(static_cast<char*>(data) + begin * row * dtype_size(dtype), dtype, device, s);
  }
  // Flattened to (numel / last, last).
  Tensor rows() const {
    int64_t last = ndim() ? shape[-1] : 1;
    return view({last ? numel() / last : 0, last});
  }
};

// Shape/dtype/device checks used by op launchers (always on).
inline void expect_shape(const Tensor& t, const Shape& s, const char* name) {
  ENSURE(t.shape == s, name, " has shape ", t.shape.str(), ", expected ", s.str());
}
inline void expect_same_device(const Tensor& a, const Tensor& b, const char* what) {
  ENSURE(a.device == b.device, what, ": tensors on ", device_name(a.device), " and ",
         device_name(b.device));
}

}  // namespace engine
