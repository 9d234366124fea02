#include "tests/common/testing.h"

#include "ops/elementwise.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <unistd.h>

#include "comm/mpi_comm.h"
#include "core/log.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#endif

namespace engine::testing {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("TEST_SEED")) return std::strtoull(s, nullptr, 0);
    return static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count()) % 1000000007ull;
  }();
  return seed;
}

PhiloxKey test_key(const std::string& name) { return philox_key(test_seed(), name); }

void set(const Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::F32: t.ptr<float>()[i] = static_cast<float>(v); break;
    case DType::F64: t.ptr<double>()[i] = v; break;
    case DType::BF16: t.ptr<bf16>()[i] = bf16(static_cast<float>(v)); break;
    case DType::I32: t.ptr<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::I64: t.ptr<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DType::U16: t.ptr<uint16_t>()[i] = static_cast<uint16_t>(v); break;
    case DType::U8: t.ptr<uint8_t>()[i] = static_cast<uint8_t>(v); break;
  }
}

double get(const Tensor& t, int64_t i) {
  ENSURE(t.device == Device::CPU, "testing::get on a device tensor");
  switch (t.dtype) {
    case DType::F32: return t.ptr<float>()[i];
    case DType::F64: return t.ptr<double>()[i];
    case DType::BF16: return static_cast<float>(t.ptr<bf16>()[i]);
    case DType::I32: return t.ptr<int32_t>()[i];
    case DType::I64: return static_cast<double>(t.ptr<int64_t>()[i]);
    case DType::U16: return t.ptr<uint16_t>()[i];
    case DType::U8: return t.ptr<uint8_t>()[i];
  }
  return 0;
}

Owned randn(Shape s, DType dtype, const std::string& name, double std) {
  Owned o = empty(s, dtype, Device::CPU);
  PhiloxKey key = test_key(name);
  const int64_t n = o.t.numel();
  // Element i is a pure function of (name, i): any thread split gives the same tensor.
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) set(o.t, i, std * philox_normal(key, i));
  return o;
}

Owned randint(Shape s, int64_t lo, int64_t hi, const std::string& name) {
  Owned o = empty(s, DType::I32, Device::CPU);
  PhiloxKey key = test_key(name);
  for (int64_t i = 0; i < o.t.numel(); ++i)
    o.ptr<int32_t>()[i] = static_cast<int32_t>(lo + static_cast<int64_t>(philox_below(key, i, hi - lo)));
  return o;
}

void poison(const Tensor& t) {
  if (t.device != Device::CPU) {
    Owned host = empty(t.shape, t.dtype, Device::CPU);
    poison(host.t);
    copy_tensor(t, host.t);
    return;
  }
  if (is_float(t.dtype)) {
    for (int64_t i = 0; i < t.numel(); ++i) set(t, i, std::nan(""));
  } else {
    std::memset(t.data, 0x7f, t.nbytes());
  }
}

Owned to_device(const Tensor& host, Device device, DType dtype) {
  ENSURE(host.device == Device::CPU, "to_device takes a CPU tensor");
  Owned converted;
  const Tensor* src = &host;
  if (dtype != host.dtype) {
    converted = empty(host.shape, dtype, Device::CPU);
    ops::cast(host, converted);
    src = &converted.t;
  }
  Owned out = empty(host.shape, dtype, device);
  copy_tensor(out, *src);
  return out;
}

Owned to_device(const Tensor& host, Device device) { return to_device(host, device, host.dtype); }

Owned to_host(const Tensor& t, DType dtype) {
  Owned same = empty(t.shape, t.dtype, Device::CPU);
  copy_tensor(same, t);
  if (dtype == t.dtype) return same;
  Owned out = empty(t.shape, dtype, Device::CPU);
  ops::cast(same, out);
  return out;
}

Owned cu_from(const std::vector<int32_t>& lengths) {
  Owned cu = empty({static_cast<int64_t>(lengths.size()) + 1}, DType::I32, Device::CPU);
  int32_t s = 0;
  cu.ptr<int32_t>()[0] = 0;
  for (size_t i = 0; i < lengths.size(); ++i) cu.ptr<int32_t>()[i + 1] = s += lengths[i];
  return cu;
}

std::vector<double> to_vector(const Tensor& t) {
  Owned host;
  const Tensor* src = &t;
  if (t.device != Device::CPU) {
    host = empty(t.shape, t.dtype, Device::CPU);
    copy_tensor(host.t, t);
    src = &host.t;
  }
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = get(*src, i);
  return v;
}

RowComparison compare_rows(const Tensor& got, const Tensor& ref, double floor,
                           const std::string& what) {
  RowComparison c;
  std::ostringstream os;
  os << what << ": " << got.numel() << " rows vs " << ref.numel();
  if (got.numel() != ref.numel()) {
    c.worst = INFINITY;
    c.report = os.str() + " (counts differ)";
    return c;
  }
  const std::vector<double> a = to_vector(got), b = to_vector(ref);
  for (size_t r = 0; r < a.size(); ++r) {
    double e = std::fabs(a[r] - b[r]) / std::max(std::fabs(b[r]), floor);
    if (!std::isfinite(a[r]) || !(e <= INFINITY)) e = INFINITY;  // NaN / inf in got or ref, 0 / 0
    if (e > c.worst) c.worst = e, c.row = static_cast<int64_t>(r);  // the first worst row
  }
  if (!a.empty())
    os << "; worst row " << c.row << ": " << a[c.row] << " vs " << b[c.row] << ", error "
       << c.worst << " of max(|ref|, " << floor << ")";
  c.report = os.str();
  return c;
}

Comparison compare(const Tensor& got, const Tensor& ref, const std::string& what) {
  Comparison c;
  std::ostringstream os;
  os << what << ": got " << got.shape.str() << " " << dtype_name(got.dtype) << " vs ref "
     << ref.shape.str() << " " << dtype_name(ref.dtype);
  if (got.numel() != ref.numel()) {
    c.rel_rms = INFINITY;
    os << " (element counts differ)";
    c.report = os.str();
    return c;
  }
  std::vector<double> a = to_vector(got), b = to_vector(ref);
  double err2 = 0, ref2 = 0;
  std::vector<std::pair<double, int64_t>> worst;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = a[i] - b[i];
    if (!std::isfinite(a[i])) c.nonfinite++;
    err2 += d * d;
    ref2 += b[i] * b[i];
    worst.emplace_back(std::isfinite(d) ? std::fabs(d) : INFINITY, static_cast<int64_t>(i));
  }
  size_t n = std::max<size_t>(a.size(), 1);
  c.scale = std::sqrt(ref2 / n);
  double err = std::sqrt(err2 / n);
  c.rel_rms = c.nonfinite ? INFINITY : (c.scale > 0 ? err / c.scale : err);
  os << "\n  rel_rms " << c.rel_rms << " (rms err " << err << ", scale " << c.scale << ")";
  if (c.nonfinite) os << ", " << c.nonfinite << " NaN/inf in got";
  size_t k = std::min<size_t>(5, worst.size());
  std::partial_sort(worst.begin(), worst.begin() + k, worst.end(),
                    [](auto& x, auto& y) { return x.first > y.first; });
  os << "\n  worst:";
  for (size_t i = 0; i < k; ++i) {
    size_t j = static_cast<size_t>(worst[i].second);
    os << " [" << j << "] " << a[j] << " vs " << b[j] << ";";
  }
  os << "\n  TEST_SEED=" << test_seed();
  c.report = os.str();
  return c;
}

bool gpu_available_or_skip() {
#ifdef ENGINE_CUDA
  if (device::count() > 0) return true;
  skip_test("no CUDA device present");
#else
  skip_test("built without CUDA (no nvcc)");
#endif
  return false;
}

bool gpus_for_ranks_or_skip(int ranks, int required) {
  if (!gpu_available_or_skip()) return false;
#ifdef ENGINE_CUDA
  if (ranks > device::count()) {
    skip_test("needs one GPU per rank");
    return false;
  }
#endif
  if (required > 0 && ranks != required) {
    skip_test("runs on " + std::to_string(required) + " ranks");
    return false;
  }
  return true;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

QuietLogs::QuietLogs() {
  if (!std::getenv("TEST_VERBOSE")) log_set_level(LogLevel::Error);
}
QuietLogs::~QuietLogs() { log_set_level(std::getenv("TEST_VERBOSE") ? LogLevel::Info : LogLevel::Warn); }

SharedDir::SharedDir(const std::string& group, const std::string& name) {
  namespace fs = std::filesystem;
  const int64_t pid = world().all_reduce_sum(int64_t{world().rank() == 0 ? ::getpid() : 0});
  path = (fs::temp_directory_path() / ("engine_dist_" + group + "." + std::to_string(pid)) / name).string();
  if (world().rank() == 0) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  world().barrier();
}

SharedDir::~SharedDir() {
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

std::string SharedDir::rank_dir() const {
  const std::string d = path + "/rank" + std::to_string(world().rank());
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace engine::testing
