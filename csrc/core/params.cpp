#include "core/params.h"

#include <vector>

#include "core/rng.h"
#include "ops/elementwise.h"

namespace engine {

namespace {
constexpr int64_t kAlign = 64;  // elements
}

const ParamSpec& ParamTable::add(ParamSpec spec) {
  ENSURE(!index_.count(spec.name), "parameter ", spec.name, " declared twice");
  ENSURE(spec.shape.numel() > 0, "parameter ", spec.name, " has empty shape ", spec.shape.str());
  int64_t off = total_;
  if (!spec.adjacent) off = (off + kAlign - 1) / kAlign * kAlign;
  ENSURE(!spec.adjacent || !entries_.empty(), "first parameter cannot be adjacent");
  spec.offset = off;
  total_ = off + spec.shape.numel();
  index_[spec.name] = entries_.size();
  entries_.push_back(std::move(spec));
  return entries_.back();
}

const ParamSpec& ParamTable::get(const std::string& name) const {
  auto it = index_.find(name);
  ENSURE(it != index_.end(), "no parameter named ", name);
  return entries_[it->second];
}

int64_t ParamTable::num_parameters() const {
  int64_t n = 0;
  for (auto& e : entries_) n += e.shape.numel();
  return n;
}

ParamStore::ParamStore(const ParamTable& table, Device device, DType compute_dtype)
    : table_(table), device_(device), compute_dtype_(compute_dtype) {
  ENSURE(compute_dtype == DType::F32 || compute_dtype == DType::F64 || compute_dtype == DType::BF16,
         "parameters in ", dtype_name(compute_dtype));
  size_t n = static_cast<size_t>(table_.total_elements());
  weights_ = Buffer(n * dtype_size(compute_dtype), device);
  if (compute_dtype == master_dtype()) {
    master_ptr_ = &weights_;
  } else {
    master_ = Buffer(n * dtype_size(master_dtype()), device);
    master_ptr_ = &master_;
  }
  grads_ = Buffer(n * dtype_size(grad_dtype()), device);
  fill_zero_bytes(weights_.data(), device, weights_.bytes());
  if (!master_aliases_weights()) fill_zero_bytes(master_.data(), device, master_.bytes());
  zero_grads();
}

Tensor ParamStore::view(const Buffer& b, DType t, const std::string& name) const {
  const ParamSpec& s = table_.get(name);
  return Tensor(static_cast<char*>(b.data()) + s.offset * dtype_size(t), t, device_, s.shape);
}

Tensor ParamStore::flat(const Buffer& b, DType t) const {
  return Tensor(b.data(), t, device_, {table_.total_elements()});
}

void ParamStore::init(uint64_t seed) {
  // Generated on the host in the master dtype, then copied: identical on every backend.
  Owned host = zeros({table_.total_elements()}, master_dtype(), Device::CPU);
  for (const ParamSpec& s : table_.entries()) {
    int64_t n = s.shape.numel();
    PhiloxKey key = philox_key(seed, s.name);
    for (int64_t i = 0; i < n; ++i) {
      double v = s.init == InitKind::Ones ? 1.0
                 : s.init == InitKind::Zeros ? 0.0
                                             : s.init_std * philox_normal(key, static_cast<uint64_t>(i));
      if (master_dtype() == DType::F64)
        host.ptr<double>()[s.offset + i] = v;
      else
        host.ptr<float>()[s.offset + i] = static_cast<float>(v);
    }
  }
  copy_tensor(master_flat(), host.t);
  sync_weights_from_master();
}

void ParamStore::sync_weights_from_master() {
  if (!master_aliases_weights()) ops::cast(master_flat(), weights_flat());
}

void ParamStore::zero_grads() { fill_zero_bytes(grads_.data(), device_, grads_.bytes()); }

}  // namespace engine
