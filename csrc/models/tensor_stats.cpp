#include "models/tensor_stats.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "ops/elementwise.h"

namespace engine {

void TensorStats::add(const Tensor& t) {
  Owned host = empty({t.numel()}, DType::F64, Device::CPU);
  if (t.device == Device::CPU && t.dtype == DType::F64) {
    copy_tensor(host, t.view({t.numel()}));
  } else {
    Owned same = empty({t.numel()}, t.dtype, Device::CPU);
    copy_tensor(same, t.view({t.numel()}));
    ops::cast(same, host);
  }
  const double* v = host.ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(v[i])) {
      nan += 1;
      continue;
    }
    sum += v[i];
    sumsq += v[i] * v[i];
    max_abs = std::max(max_abs, std::abs(v[i]));
  }
  count += static_cast<double>(t.numel());
}

double TensorStats::std() const {
  const double n = count - nan;
  if (n <= 0) return 0;
  const double m = sum / n;
  return std::sqrt(std::max(0.0, sumsq / n - m * m));
}

StatsRecorder::StatsRecorder(int num_layers) {
  names_.push_back(forward_name(-1));
  for (int i = 0; i < num_layers; ++i) names_.push_back(forward_name(i));
  names_.push_back(kHeadGrad);
  for (int i = num_layers; i-- > 0;) names_.push_back(backward_name(i));
  clear();
}

std::string StatsRecorder::forward_name(int layer) {
  return layer < 0 ? "embedding.out" : "layers." + std::to_string(layer) + ".out";
}

std::string StatsRecorder::backward_name(int layer) {
  return "layers." + std::to_string(layer) + ".in_grad";
}

void StatsRecorder::record(const std::string& name, const Tensor& x) {
  auto it = stats_.find(name);
  ENSURE(it != stats_.end(), "no tensor statistics named ", name);
  it->second.add(x);
}

void StatsRecorder::merge(Comm& all) {
  if (all.size() == 1) return;
  for (const std::string& n : names_) {
    TensorStats& s = stats_[n];
    s.count = all.all_reduce_sum(s.count);
    s.sum = all.all_reduce_sum(s.sum);
    s.sumsq = all.all_reduce_sum(s.sumsq);
    s.nan = all.all_reduce_sum(s.nan);
    s.max_abs = all.all_reduce_max(s.max_abs);
  }
}

void StatsRecorder::clear() {
  stats_.clear();
  for (const std::string& n : names_) stats_[n] = TensorStats{};
}

}  // namespace engine
