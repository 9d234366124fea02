#include "core/params.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/checked.h"
#include "core/rng.h"

namespace engine {

namespace {
constexpr int64_t kAlign = 64;  // elements
}

ParamTable::ParamTable(int tp_rank, int tp_size) : tp_rank_(tp_rank), tp_size_(tp_size) {
  ENSURE(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tensor-parallel rank ", tp_rank, " of ", tp_size);
}

const ParamSpec& ParamTable::add(ParamSpec spec) {
  ENSURE(!index_.count(spec.name), "parameter ", spec.name, " declared twice");
  int64_t numel = 0;
  try {
    numel = spec.shape.numel();
  } catch (const Error& e) {
    RAISE("parameter ", spec.name, ": ", e.what());
  }
  ENSURE(numel > 0, "parameter ", spec.name, " has empty shape ", spec.shape.str());
  ENSURE(spec.init != InitKind::InvSoftplusLogUniform ||
             (spec.init_low > 0 && spec.init_low <= spec.init_high && spec.init_floor >= 0),
         "parameter ", spec.name, ": log-uniform init range [", spec.init_low, ", ", spec.init_high,
         "] (floor ", spec.init_floor, ") must have 0 < low <= high");
  spec.full_shape = spec.shape;
  if (spec.split_dim >= 0) {
    ENSURE(spec.split_dim < spec.shape.ndim, "parameter ", spec.name,
           ": split dimension ", spec.split_dim, " of shape ", spec.shape.str());
    const int64_t n = spec.shape[spec.split_dim];
    ENSURE(n % tp_size_ == 0, "parameter ", spec.name, " ", spec.shape.str(), ": dimension ", spec.split_dim,
           " does not split over ", tp_size_, " tensor-parallel ranks");
    spec.shape.d[spec.split_dim] = n / tp_size_;
    spec.split_begin = n / tp_size_ * tp_rank_;
  }
  spec.frozen = frozen_rule_ && frozen_rule_(spec.name);
  ENSURE(!spec.adjacent || !entries_.empty(), "first parameter cannot be adjacent");
  ENSURE(!spec.adjacent || entries_.back().frozen == spec.frozen, "parameter ", spec.name,
         " is adjacent to ", entries_.back().name, " but only one of them is frozen");
  int64_t& total = spec.frozen ? frozen_total_ : total_;
  int64_t off = total;
  if (!spec.adjacent) off = checked_add<int64_t>(off, kAlign - 1, "parameter ", spec.name, ": flat offset") / kAlign * kAlign;
  spec.offset = off;
  total = checked_add<int64_t>(off, spec.shape.numel(), "parameter ", spec.name, " ", spec.shape.str(),
                               ": the flat parameter buffers' length");
  index_[spec.name] = entries_.size();
  entries_.push_back(std::move(spec));
  return entries_.back();
}

const ParamSpec& ParamTable::get(const std::string& name) const {
  auto it = index_.find(name);
  ENSURE(it != index_.end(), "no parameter named ", name);
  return entries_[it->second];
}

int64_t ParamTable::num_full_parameters() const {
  int64_t n = 0;
  for (auto& e : entries_) n = checked_add<int64_t>(n, e.full_shape.numel(), "the model's parameter count");
  return n;
}

int64_t ParamTable::num_parameters() const {
  int64_t n = 0;
  for (auto& e : entries_) n = checked_add<int64_t>(n, e.shape.numel(), "the parameter count of this rank");
  return n;
}

namespace {

// A block split along dimension d is (outer, local, inner): outer = the product of the dims
// before d, local = this rank's extent of d, inner = the product of the dims after d. For each
// outer index the block's local * inner elements are contiguous in the full tensor too.
int64_t inner_of(const Shape& s, int d) {
  int64_t inner = 1;
  for (int i = d + 1; i < s.ndim; ++i) inner *= s[i];
  return inner;
}

}  // namespace

int64_t full_index(const ParamSpec& s, int64_t i) {
  if (s.split_dim < 0) return i;
  const int64_t inner = inner_of(s.shape, s.split_dim), slab = s.shape[s.split_dim] * inner;
  if (slab == 0) return i;
  const int64_t outer = i / slab, rest = i % slab;
  return (outer * s.full_shape[s.split_dim] + s.split_begin) * inner + rest;
}

void for_each_full_run(const ParamSpec& s, int64_t lo, int64_t hi,
                       const std::function<void(int64_t, int64_t, int64_t)>& f) {
  if (lo >= hi) return;
  if (s.split_dim < 0) return f(lo, hi - lo, lo);
  const int64_t slab = s.shape[s.split_dim] * inner_of(s.shape, s.split_dim);
  for (int64_t i = lo; i < hi;) {
    const int64_t n = std::min(hi, (i / slab + 1) * slab) - i;  // to the end of the local slab
    f(full_index(s, i), n, i);
    i += n;
  }
}

BlockRun block_of_full(const Shape& full_shape, int split_dim, int tp_size, int64_t g, int64_t hi) {
  ENSURE(0 <= g && g < hi && hi <= full_shape.numel(), "block_of_full: elements [", g, ", ", hi,
         ") of ", full_shape.str());
  if (split_dim < 0 || tp_size == 1) return {0, g, hi - g};
  ENSURE(split_dim < full_shape.ndim && full_shape[split_dim] % tp_size == 0, "block_of_full: ",
         full_shape.str(), " does not split along dimension ", split_dim, " over ", tp_size);
  const int64_t inner = inner_of(full_shape, split_dim), full = full_shape[split_dim];
  const int64_t local = full / tp_size;
  const int64_t outer = g / (full * inner), j = (g / inner) % full, rest = g % inner;
  const int rank = static_cast<int>(j / local);
  const int64_t jl = j % local;
  return {rank, (outer * local + jl) * inner + rest, std::min(hi - g, (local - jl) * inner - rest)};
}

namespace {

// Element i (index in the full tensor) of parameter s under the key of (seed, s.name).
double init_value(const ParamSpec& s, PhiloxKey key, int64_t i) {
  const uint64_t c = static_cast<uint64_t>(i);
  switch (s.init) {
    case InitKind::Ones: return 1.0;
    case InitKind::Zeros: return 0.0;
    case InitKind::Normal: return s.init_std * philox_normal(key, c);
    case InitKind::Uniform: return s.init_std * (2.0 * bits_to_unit(philox4x32(key, c).v[0]) - 1.0);
    case InitKind::LogColumnIndex: return std::log(1.0 + static_cast<double>(i % s.full_shape[-1]));
    case InitKind::InvSoftplusLogUniform: {
      const double lo = std::log(s.init_low), hi = std::log(s.init_high);
      const double dt = std::max(std::exp(lo + (hi - lo) * bits_to_unit(philox4x32(key, c).v[0])), s.init_floor);
      return dt + std::log(-std::expm1(-dt));  // softplus^-1(dt) = log(e^dt - 1)
    }
  }
  return 0.0;
}

}  // namespace

void init_values(const ParamTable& table, uint64_t seed, int64_t begin, int64_t end, const Tensor& out,
                 bool frozen) {
  ENSURE(out.device == Device::CPU && (out.dtype == DType::F32 || out.dtype == DType::F64),
         "init_values writes a host f32 or f64 tensor");
  ENSURE(0 <= begin && begin <= end && out.numel() == end - begin, "init_values: range [", begin, ", ", end,
         ") into ", out.numel(), " elements");
  zero_tensor(out);
  for (const ParamSpec& s : table.entries()) {
    if (s.frozen != frozen) continue;  // the other flat space
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.shape.numel());
    if (lo >= hi) continue;
    const PhiloxKey key = philox_key(seed, s.name);
    const bool f64 = out.dtype == DType::F64;
    void* base = out.data;
    // Every element is a pure function of its index: any thread split gives the same values.
#pragma omp parallel for schedule(static) if (hi - lo > (1 << 16))
    for (int64_t g = lo; g < hi; ++g) {
      const int64_t i = full_index(s, g - s.offset);  // index within the full parameter
      const double v = init_value(s, key, i);
      if (f64)
        static_cast<double*>(base)[g - begin] = v;
      else
        static_cast<float*>(base)[g - begin] = static_cast<float>(v);
    }
  }
}

ParamStore::ParamStore(const ParamTable& table, Device device, DType compute_dtype, int64_t capacity,
                       int64_t pad_multiple)
    : table_(table), device_(device), compute_dtype_(compute_dtype),
      capacity_(checked_add<int64_t>(std::max(capacity, table.total_elements()), pad_multiple - 1,
                                     "parameter buffer length") /
                pad_multiple * pad_multiple) {
  ENSURE(pad_multiple >= 1, "parameter buffer padded to a multiple of ", pad_multiple);
  ENSURE(compute_dtype == DType::F32 || compute_dtype == DType::F64 || compute_dtype == DType::BF16,
         "parameters in ", dtype_name(compute_dtype));
  allocate_weights();
  if (table.frozen_elements() > 0) {
    frozen_ = Buffer(checked_mul<size_t>(static_cast<size_t>(table.frozen_elements()), dtype_size(compute_dtype_),
                                         "frozen weight buffer bytes"),
                     device);
    fill_zero_bytes(frozen_.data(), device_, frozen_.bytes());
  }
  grads_ = Buffer(checked_mul<size_t>(static_cast<size_t>(capacity_), dtype_size(grad_dtype()), "gradient buffer bytes"),
                  device);
  zero_grads();
}

void ParamStore::allocate_weights() {
  if (has_weights()) return;
  weights_ = Buffer(
      checked_mul<size_t>(static_cast<size_t>(capacity_), dtype_size(compute_dtype_), "weight buffer bytes"), device_);
  fill_zero_bytes(weights_.data(), device_, weights_.bytes());
}

ParamStore::~ParamStore() {
  try {
    wait_weights(capacity_);
  } catch (...) {  // (a failing device at exit: nothing left to order)
  }
}

void ParamStore::release_weights() {
  wait_weights(capacity_);
  weights_.release();
}

void ParamStore::set_pending_weights(std::vector<PendingWeights> ranges) {
  wait_weights(capacity_);
  for (size_t i = 0; i < ranges.size(); ++i)
    ENSURE(ranges[i].begin >= 0 && ranges[i].begin < capacity_ && (i == 0 || ranges[i].begin > ranges[i - 1].begin) &&
               ranges[i].wait,
           "pending weight range ", i, " begins at ", ranges[i].begin, ": not increasing within the buffer");
  pending_.assign(std::make_move_iterator(ranges.begin()), std::make_move_iterator(ranges.end()));
}

void ParamStore::wait_weights(int64_t end) const {
  while (!pending_.empty() && pending_.front().begin < end) {
    pending_.front().wait();
    pending_.pop_front();
  }
}

Tensor ParamStore::weight_at(int64_t offset, Shape s) const {
  ENSURE(has_weights(), "weights are not resident (ZeRO-3: gathered only during a step)");
  wait_weights(offset + s.numel());
  return Tensor(static_cast<char*>(weights_.data()) + offset * static_cast<int64_t>(dtype_size(compute_dtype_)),
                compute_dtype_, device_, s);
}

Tensor ParamStore::frozen_weight_at(int64_t offset, Shape s) const {
  ENSURE(offset >= 0 && offset + s.numel() <= table_.frozen_elements(), "frozen weight view [", offset, ", ",
         offset + s.numel(), ") past the frozen buffer's ", table_.frozen_elements(), " elements");
  return Tensor(static_cast<char*>(frozen_.data()) + offset * static_cast<int64_t>(dtype_size(compute_dtype_)),
                compute_dtype_, device_, s);
}

Tensor ParamStore::frozen_flat() const { return frozen_weight_at(0, {table_.frozen_elements()}); }

Tensor ParamStore::grad_at(int64_t offset, Shape s) const {
  return Tensor(static_cast<char*>(grads_.data()) + offset * static_cast<int64_t>(dtype_size(grad_dtype())),
                grad_dtype(), device_, s);
}

Tensor ParamStore::weight(const std::string& name) const {
  const ParamSpec& s = table_.get(name);
  return s.frozen ? frozen_weight_at(s.offset, s.shape) : weight_at(s.offset, s.shape);
}

Tensor ParamStore::grad(const std::string& name) const {
  const ParamSpec& s = table_.get(name);
  ENSURE(!s.frozen, "parameter ", name, " is frozen: it has no gradient");
  return grad_at(s.offset, s.shape);
}

Tensor ParamStore::weights_flat() const { return weight_at(0, {capacity_}); }
Tensor ParamStore::grads_flat() const { return grad_at(0, {capacity_}); }

namespace {
// Init values of one flat space into `dst` (`n` elements): generated on the host in f32 (f64 for
// an f64 model), then converted, so identical on every backend and layout.
void init_space(const ParamTable& table, uint64_t seed, bool frozen, int64_t n, DType dtype, const Tensor& dst) {
  const DType host_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
  Owned host = empty({n}, host_dtype, Device::CPU);
  init_values(table, seed, 0, n, host, frozen);
  if (host_dtype == dtype) {
    copy_tensor(dst, host);
    return;
  }
  // f32 -> bf16, rounded to nearest even as the CPU cast op does.
  ENSURE(host_dtype == DType::F32 && dtype == DType::BF16, "parameter init: no conversion from ",
         dtype_name(host_dtype), " to ", dtype_name(dtype));
  Owned converted = empty({n}, DType::BF16, Device::CPU);
  const float* src = host.ptr<float>();
  bf16* out = converted.ptr<bf16>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16(src[i]);
  copy_tensor(dst, converted);
}
}  // namespace

void ParamStore::init(uint64_t seed) {
  init_space(table_, seed, false, capacity_, compute_dtype_, weights_flat());
  if (table_.frozen_elements() > 0)
    init_space(table_, seed, true, table_.frozen_elements(), compute_dtype_, frozen_flat());
}

void ParamStore::zero_grads() { fill_zero_bytes(grads_.data(), device_, grads_.bytes()); }

}  // namespace engine
