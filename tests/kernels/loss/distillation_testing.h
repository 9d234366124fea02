// Helpers shared by the CUDA distillation tests (test_distillation.cpp: the fused kernels;
// test_distillation_vocab_parallel.cpp: partial, combine, grad): the loss mixes, device inputs
// and their f64 copies, a fused run on a forced or the Auto path, and the loss and gradient
// checks against the f64 reference.
//
// Tolerances (relative RMS over the tensor, tests/common/testing.h). Both sides see identical
// inputs, so the only error is the kernels' f32 arithmetic (ex2.approx ~2^-22 per term, f32 sums,
// every logit difference formed before scaling):
//   losses    1e-4 per row, relative to max(|loss|, 0.1) (measured ~1e-6 of the loss). A row's
//             log-sum-exps are each ~1 after the shift, so their f32 rounding leaves ~6e-8
//             absolute whatever the loss: the KL of a near-identical pair (~1e-4 and below) is off
//             by a few 1e-4 of itself (H200, TEST_SEED=864235171: 6.4e-8 on 3.3e-4, one row,
//             V = 2), which a bound relative to the loss alone, or to the tensor's RMS, rejects.
//   gradient  f32 output: 1e-4; ReverseKL 2e-3: its gradient s_v ((x_v - y_v) / tau - c) cancels
//             at the dominant columns of peaked rows, where the f32 rounding of c (~|c| 2^-24)
//             is what is left (a naive f32 computation is ~100x worse there). bf16 output: at
//             most 2x the error of rounding the f64 reference to bf16, plus that f32 allowance.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "cuda/loss/distillation.cuh"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "tests/common/gpu_testing.h"

namespace engine::testing::distill {

using cuda::DistillPath;
using ops::DistillKind;
using ops::DistillParams;

inline std::string mix_name(const DistillParams& p) {
  return std::string(ops::distill_kind_name(p.kind)) + " tau " + std::to_string(p.temperature) +
         (p.label_weight != 0 ? " +label+z" : "");
}

// Every kind at tau 1 and 2.5, alone and with the label term; for large rows a third of them
// (every kind, each temperature and label setting at least once) to keep the f64 reference quick.
inline std::vector<DistillParams> mixes(int64_t v) {
  std::vector<DistillParams> all;
  for (DistillKind kind : {DistillKind::SoftCE, DistillKind::ForwardKL, DistillKind::ReverseKL})
    for (float tau : {1.f, 2.5f})
      for (bool label : {false, true})
        all.push_back({kind, tau, label ? 0.6f : 0.f, label ? 0.4f : 1.f, label ? 1e-3f : 0.f});
  if (v < 20000) return all;
  std::vector<DistillParams> some;
  for (size_t i = 0; i < all.size(); i += 3) some.push_back(all[i]);
  return some;
}

struct Variant {
  DistillPath path;
  int cluster;
  std::string name() const {
    const char* n[] = {"Auto", "WarpRows", "BlockRows", "Cluster"};
    return std::string(n[static_cast<int>(path)]) + (cluster ? " C" + std::to_string(cluster) : "");
  }
};

// Device inputs: labels uniform in [0, V) with labels at 0 and V - 1, every 5th row (from row 3)
// masked with an out-of-range label that must be ignored.
struct Inputs {
  DeviceTensor logits, teacher;
  int64_t offset = 0;
  Owned x64, y64;  // the device values in f64 on the CPU
  Owned labels_host, mask_host, labels, mask;
};

inline Inputs make_inputs(int64_t t, int64_t v, double shift, double teacher_shift, double mul,
                          int64_t offset, int64_t teacher_offset, DType dtype) {
  Inputs in;
  Owned x = randn({t, v}, DType::F32, "dl.logits", 2.0),
        y = randn({t, v}, DType::F32, "dl.teacher", 3.0);
  for (int64_t i = 0; i < t * v; ++i) {
    x.ptr<float>()[i] = static_cast<float>(mul * x.ptr<float>()[i] + shift);
    y.ptr<float>()[i] = static_cast<float>(mul * y.ptr<float>()[i] + teacher_shift);
  }
  in.offset = offset;
  in.logits = to_gpu(x.t, dtype, offset);
  in.teacher = to_gpu(y.t, dtype, teacher_offset);
  in.x64 = to_host(in.logits.t, DType::F64);
  in.y64 = to_host(in.teacher.t, DType::F64);
  in.labels_host = randint({t}, 0, v, "dl.labels");
  in.mask_host = empty({t}, DType::U8, Device::CPU);
  int32_t* lab = in.labels_host.ptr<int32_t>();
  uint8_t* msk = in.mask_host.ptr<uint8_t>();
  for (int64_t r = 0; r < t; ++r) {
    msk[r] = r % 5 != 3;
    if (!msk[r]) lab[r] = r % 2 ? -7 : static_cast<int32_t>(v + 3);
  }
  lab[0] = static_cast<int32_t>(v - 1);
  if (t > 1) lab[1] = 0;
  in.labels = to_device(in.labels_host.t, Device::CUDA);
  in.mask = to_device(in.mask_host.t, Device::CUDA);
  return in;
}

// The labels argument: undefined without a label term (it must then never be read).
inline Tensor labels_arg(const Inputs& in, const DistillParams& p) {
  return p.label_weight != 0 ? in.labels.t : Tensor{};
}

struct Outputs {
  Owned losses, distill, logits;  // host copies: (T) f32, (T) f32, (T, V) in the logits' dtype
};

inline Outputs run_device(const Inputs& in, const DistillParams& p, bool with_grad, float scale,
                          const Variant& var) {
  const DeviceTensor logits = gpu_empty(in.logits.t.shape, in.logits.t.dtype, in.offset);
  copy_tensor(logits.t, in.logits.t);
  const int64_t t = in.logits.t.size(0);
  DeviceTensor losses = gpu_poisoned({t}, DType::F32), distill = gpu_poisoned({t}, DType::F32);
  if (var.path == DistillPath::Auto) {
    ops::distillation_loss(logits.t, in.teacher.t, labels_arg(in, p), in.mask, p, losses.t,
                           distill.t, with_grad, scale);
  } else {
#ifdef ENGINE_CUDA
    cuda::distillation_loss(logits.t, in.teacher.t, labels_arg(in, p), in.mask, p, losses.t,
                            distill.t, with_grad, scale, var.path, var.cluster);
#endif
  }
  return {to_host(losses.t, DType::F32), to_host(distill.t, DType::F32),
          to_host(logits.t, logits.t.dtype)};
}

inline double rounding_error(const Tensor& ref, DType dtype) {
  if (dtype != DType::BF16) return 0;
  Owned rounded = empty(ref.shape, DType::BF16, Device::CPU);
  ops::cast(ref, rounded);
  return compare(rounded, ref).rel_rms;
}

// Losses (T values, any dtype) against a reference, row by row: |got - ref| <= tol max(|ref|, 0.1)
// (the tolerances at the top of this file).
inline void check_rows(const Tensor& got, const Tensor& ref, double tol, const char* what) {
  INFO(what);
  CHECK_ROWS_CLOSE(got, ref, tol, 0.1);
}

inline double grad_allowance(const DistillParams& p) {
  return p.kind == DistillKind::ReverseKL ? 2e-3 : 1e-4;
}

// Checks a device gradient against the f64 reference.
inline void check_grad(const Tensor& got, const Tensor& ref, DType dtype, const DistillParams& p,
                       const std::string& what) {
  const Comparison g = compare(got, ref, what);
  INFO(g.report);
  CHECK(g.nonfinite == 0);
  CHECK(g.rel_rms <= 2 * rounding_error(ref, dtype) + grad_allowance(p));
}

}  // namespace engine::testing::distill
