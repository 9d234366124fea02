// The capability layer (cuda/common/arch.h): what it says about the running code agrees with what
// that code does when it runs, and no Hopper kernel is chosen where the code lacks sm_90a (an
// SM=80 build on an H200 runs the driver-compiled PTX of sm_80, whose Hopper kernels are empty).
#include <doctest/doctest.h>

#include <string>

#include "tests/common/gpu_testing.h"

#ifdef ENGINE_CUDA
#include "cuda/attention/flash.cuh"
#include "cuda/common/arch.h"
#include "cuda/loss/cross_entropy.cuh"
#include "cuda/loss/distillation.cuh"
#include "cuda/moe/moe.cuh"
#endif

using namespace engine;

TEST_CASE("capability layer: the probe kernel's code is the code the query reports" * doctest::test_suite("gpu")) {
  if (!testing::gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  const cuda::arch::Capability& c = cuda::arch::current();
  MESSAGE(cuda::arch::describe(c));
  // The probe writes __CUDA_ARCH__ / 10 * 2 + (sm_90a features compiled in).
  CHECK(cuda::arch::probe_on_device() == c.code_arch * 2 + (c.sm90a_code ? 1 : 0));
  CHECK(c.code_arch <= c.device_major * 10 + c.device_minor);
  CHECK(c.clusters == (c.device_major >= 9 && c.code_arch >= 90));
  CHECK(c.pdl == c.clusters);
  CHECK(c.tma == c.clusters);
  CHECK(c.wgmma == (c.sm90a_code && c.device_major == 9 && c.device_minor == 0));
  CHECK(&cuda::arch::current() == &c);  // cached
#endif
}

TEST_CASE("capability layer: Hopper kernels are chosen only where the code has them" * doctest::test_suite("gpu")) {
  if (!testing::gpu_available_or_skip()) return;
#ifdef ENGINE_CUDA
  const cuda::arch::Capability& c = cuda::arch::current();
  const std::string line = cuda::arch::kernels_line();
  MESSAGE(line);
  INFO(line);
  for (int d : {64, 128}) CHECK((!cuda::attention_sm90_available(d) || c.wgmma));
  CHECK((!cuda::grouped_hopper_available() || c.wgmma));
  // On an sm_90a build on an H200 the Hopper kernels are the ones chosen.
  if (c.wgmma) {
    CHECK(cuda::attention_sm90_available(64));
    CHECK(cuda::grouped_hopper_available());
  }
  CHECK((line.find("attention flash sm90") != std::string::npos) ==
        cuda::attention_sm90_available(64));
  CHECK((line.find("grouped GEMM wgmma") != std::string::npos) == cuda::grouped_hopper_available());
  // The loss kernels' Cluster path exists exactly where clusters do; Auto falls back to the
  // per-block rows elsewhere.
  using cuda::CrossEntropyPath;
  using cuda::DistillPath;
  CHECK(cuda::cross_entropy_plan(32000, DType::BF16, CrossEntropyPath::Cluster).has_value() == c.clusters);
  CHECK(cuda::distillation_plan(32000, DType::BF16, true, DistillPath::Cluster).has_value() == c.clusters);
  if (!c.clusters) {
    CHECK(cuda::cross_entropy_plan(128256, DType::BF16)->path == CrossEntropyPath::BlockRows);
    CHECK(cuda::distillation_plan(50257, DType::BF16, true)->path == DistillPath::BlockRows);
  }
#endif
}
