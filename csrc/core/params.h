// Parameters live in flat buffers, one per kind, laid out from a table:
//   weights   compute dtype (f32 on CPU, bf16 on GPU; f64 for gradient checks)
//   master    f32 copy the optimizer updates (aliases `weights` when the compute dtype is f32)
//   grads     f32 (f64 for an f64 model), accumulated (+=) by every backward
//   exp_avg, exp_avg_sq   AdamW moments, f32 (allocated by the optimizer)
// A parameter is a view at its offset in each buffer. Entries declared `adjacent` follow the
// previous entry with no gap, so a layer can view them as one matrix (q, k, v -> one qkv GEMM;
// gate, up -> one GEMM); other entries start on a 64-element boundary.
// Init is layout independent: element i of parameter `name` (i counted in the full, unsharded
// tensor) is drawn from Philox keyed by (seed, name) at counter i.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/buffer.h"

namespace engine {

enum class InitKind { Normal, Ones, Zeros };

struct ParamSpec {
  std::string name;         // e.g. "layers.3.attn.wq"; also the init RNG key
  Shape shape;              // full (unsharded) shape
  InitKind init = InitKind::Normal;
  double init_std = 0.02;   // for InitKind::Normal
  bool weight_decay = true; // false for norms and biases
  bool adjacent = false;    // placed right after the previous entry (no alignment gap)
  int64_t offset = 0;       // element offset in the flat buffers (set by ParamTable::add)
};

class ParamTable {
 public:
  const ParamSpec& add(ParamSpec spec);
  const ParamSpec& get(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const std::vector<ParamSpec>& entries() const { return entries_; }
  int64_t total_elements() const { return total_; }   // including alignment gaps
  int64_t num_parameters() const;                     // sum of numel over entries

 private:
  std::vector<ParamSpec> entries_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0;
};

class ParamStore {
 public:
  // compute_dtype: F32 or F64 on CPU, BF16 (or F32) on CUDA.
  ParamStore(const ParamTable& table, Device device, DType compute_dtype);

  const ParamTable& table() const { return table_; }
  Device device() const { return device_; }
  DType compute_dtype() const { return compute_dtype_; }

  Tensor weight(const std::string& name) const { return view(weights_, compute_dtype_, name); }
  Tensor master(const std::string& name) const { return view(*master_ptr_, master_dtype(), name); }
  Tensor grad(const std::string& name) const { return view(grads_, grad_dtype(), name); }
  // Whole flat buffers (for the optimizer, grad norm, collectives).
  Tensor weights_flat() const { return flat(weights_, compute_dtype_); }
  Tensor master_flat() const { return flat(*master_ptr_, master_dtype()); }
  Tensor grads_flat() const { return flat(grads_, grad_dtype()); }
  bool master_aliases_weights() const { return master_ptr_ == &weights_; }

  // Fills every parameter from its spec (Philox normal / ones / zeros) and syncs weights.
  void init(uint64_t seed);
  // After the optimizer updated master: weights = cast(master) (no-op when aliased).
  void sync_weights_from_master();
  void zero_grads();

 private:
  DType master_dtype() const { return compute_dtype_ == DType::F64 ? DType::F64 : DType::F32; }
  DType grad_dtype() const { return master_dtype(); }
  Tensor view(const Buffer& b, DType t, const std::string& name) const;
  Tensor flat(const Buffer& b, DType t) const;

  ParamTable table_;
  Device device_;
  DType compute_dtype_;
  Buffer weights_, master_, grads_;
  const Buffer* master_ptr_ = nullptr;
};

}  // namespace engine
