// Helpers of the GPU kernel tests (tests/kernels): device tensors placed at an element offset in
// their own allocation (offset 1: a pointer aligned to the element size only, which sends the
// kernels down their scalar paths), device inputs with the f64 values the reference runs on,
// poisoned device outputs, the bf16 tolerance and bitwise comparison. The host-side helpers they
// build on (randn, to_device, to_host, poison, compare) are tests/common/testing.h; these live
// apart so that test files with helpers of the same names (tests/kernels/attention) are unaffected.
#pragma once
#include <cstdint>

#include <doctest/doctest.h>

#include "tests/common/testing.h"

namespace engine::testing {

// A device tensor: the owning allocation and the view an op sees, `offset` elements into it.
struct DeviceTensor {
  Owned storage;
  Tensor t;
};

// A copy of the CPU tensor `host` on the GPU in `dtype` (floats converted on the CPU with
// ops::cast, as to_device), starting `offset` elements into an allocation of numel + offset.
DeviceTensor to_gpu(const Tensor& host, DType dtype, int64_t offset = 0);
DeviceTensor to_gpu(const Tensor& host, int64_t offset = 0);  // in host's dtype

// A device input of a kernel test and, for the f64 reference, its values as the device holds
// them (rounded to dtype), so that both sides see the same numbers.
struct DeviceInput {
  DeviceTensor dev;
  Owned f64;  // on the CPU
};
DeviceInput device_input(const Tensor& host, DType dtype, int64_t offset = 0);

// An uninitialised device tensor `offset` elements into an allocation of numel + offset.
DeviceTensor gpu_empty(Shape s, DType dtype, int64_t offset = 0);

// A poisoned device tensor (testing::poison: NaN or 0x7f bytes) `offset` elements into its
// allocation. The allocation keeps one spare element past the end, so even an empty tensor has
// a non-null pointer (the ops' dispatch takes a null pointer for an unset optional argument).
DeviceTensor gpu_poisoned(Shape s, DType dtype, int64_t offset = 0);

// Tolerance of a bf16 output against its exact (f64) reference: twice the relative RMS error
// of rounding ref to bf16, plus a floor of 1e-4 (a kernel that computes in f32 and rounds once
// makes that rounding error plus f32 noise).
double bf16_tol(const Tensor& ref);
// bf16_tol(ref) for a bf16 output, f32_tol for an f32 one.
double output_tol(DType out, const Tensor& ref, double f32_tol);

// Same dtype, element count and bytes, the tensors on any devices.
bool bitwise_equal(const Tensor& a, const Tensor& b);

}  // namespace engine::testing

// A sweep of a GPU test over shape cases in two tiers: `fn(small)` in the "gpu" suite (the tier
// run on every change: each kernel path and instantiation once, on few rows) and `fn(large)` in
// the opt-in "gpu-slow" suite (the shapes whose row counts add what the small ones cannot: many
// rows per warp or block, long runs, wide grids). The two lists together are the whole sweep.
#define GPU_TEST_SWEEP(name, fn, small, large)                                  \
  TEST_CASE(name " (small shapes)" * doctest::test_suite("gpu")) { fn(small); } \
  TEST_CASE(name " (large shapes)" * doctest::test_suite("gpu-slow")) { fn(large); }
