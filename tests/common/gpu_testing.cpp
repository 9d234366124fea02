#include "tests/common/gpu_testing.h"

#include <cmath>
#include <cstring>
#include <utility>

namespace engine::testing {

namespace {

// A view `offset` elements into a fresh device allocation of numel + offset + spare elements.
DeviceTensor placed(Shape s, DType dtype, int64_t offset, int64_t spare) {
  DeviceTensor d;
  d.storage = empty({s.numel() + offset + spare}, dtype, Device::CUDA);
  const int64_t skip = offset * static_cast<int64_t>(dtype_size(dtype));
  d.t = Tensor(static_cast<char*>(d.storage.t.data) + skip, dtype, Device::CUDA, s);
  return d;
}

}  // namespace

DeviceTensor gpu_empty(Shape s, DType dtype, int64_t offset) { return placed(s, dtype, offset, 0); }

DeviceTensor to_gpu(const Tensor& host, DType dtype, int64_t offset) {
  ENSURE(host.device == Device::CPU, "to_gpu takes a CPU tensor");
  DeviceTensor d = gpu_empty(host.shape, dtype, offset);
  copy_tensor(d.t, to_host(host, dtype));  // converted on the CPU
  return d;
}

DeviceTensor to_gpu(const Tensor& host, int64_t offset) { return to_gpu(host, host.dtype, offset); }

DeviceInput device_input(const Tensor& host, DType dtype, int64_t offset) {
  DeviceTensor dev = to_gpu(host, dtype, offset);
  Owned f64 = to_host(dev.t, DType::F64);
  return {std::move(dev), std::move(f64)};
}

DeviceTensor gpu_poisoned(Shape s, DType dtype, int64_t offset) {
  DeviceTensor d = placed(s, dtype, offset, 1);
  poison(d.t);
  return d;
}

double bf16_tol(const Tensor& ref) {
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double v = get(ref, i), r = static_cast<float>(bf16(static_cast<float>(v)));
    err2 += (r - v) * (r - v);
    ref2 += v * v;
  }
  return 2 * (ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0) + 1e-4;
}

double output_tol(DType out, const Tensor& ref, double f32_tol) {
  return out == DType::BF16 ? bf16_tol(ref) : f32_tol;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype || a.numel() != b.numel()) return false;
  Owned ha = to_host(a, a.dtype), hb = to_host(b, b.dtype);
  return std::memcmp(ha.t.data, hb.t.data, ha.t.nbytes()) == 0;
}

}  // namespace engine::testing
