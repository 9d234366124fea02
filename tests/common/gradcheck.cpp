#include "tests/common/gradcheck.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace engine::testing {

double dot(const Tensor& a, const Tensor& b) {
  ENSURE_EQ(a.numel(), b.numel());
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += get(a, i) * get(b, i);
  return s;
}

Comparison finite_difference_check(const std::function<double()>& loss, const Tensor& theta,
                                   const Tensor& analytic, const std::string& what,
                                   int64_t max_elements, double eps) {
  ENSURE(theta.dtype == DType::F64 && theta.device == Device::CPU, "gradient checks run in f64 on CPU");
  ENSURE_EQ(theta.numel(), analytic.numel());
  std::vector<int64_t> idx(static_cast<size_t>(theta.numel()));
  std::iota(idx.begin(), idx.end(), 0);
  if (theta.numel() > max_elements) {  // seeded partial Fisher-Yates: a random subset
    PhiloxKey key = test_key("fd:" + what);
    for (int64_t i = 0; i < max_elements; ++i) {
      int64_t j = i + static_cast<int64_t>(philox_below(key, static_cast<uint64_t>(i),
                                                         static_cast<uint64_t>(theta.numel() - i)));
      std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(j)]);
    }
    idx.resize(static_cast<size_t>(max_elements));
  }
  const int64_t n = static_cast<int64_t>(idx.size());
  Owned numeric = empty({n}, DType::F64, Device::CPU), picked = empty({n}, DType::F64, Device::CPU);
  double* p = theta.ptr<double>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = idx[static_cast<size_t>(k)];
    const double orig = p[i];
    p[i] = orig + eps;
    const double up = loss();
    p[i] = orig - eps;
    const double down = loss();
    p[i] = orig;
    numeric.ptr<double>()[k] = (up - down) / (2 * eps);
    picked.ptr<double>()[k] = get(analytic, i);
  }
  return compare(picked, numeric, what + " (analytic vs finite differences)");
}

}  // namespace engine::testing
