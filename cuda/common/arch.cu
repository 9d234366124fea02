// The capability layer's host side (arch.h): the device's compute capability and, through a
// probe kernel's attributes, the code of this binary the driver chose for the device.
//
// How the code is known without a launch: the probe kernel's launch bound is a constant of its
// compilation pass (64 threads in the sm_90a pass, 32 in every other), and the driver reports the
// loaded code's bound (cudaFuncAttributes::maxThreadsPerBlock) and the virtual architecture it
// was compiled from (ptxVersion). On an H200 running an SM=80 build the driver compiles the
// compute_80 PTX at load: binaryVersion is then 90 but ptxVersion 80 and the bound 32, so the
// empty Hopper kernel bodies of that PTX are never selected. Every kernel of one binary is
// compiled with the same -gencode list (Makefile GENCODE), so one probe answers for all of them.
#include "cuda/common/arch.h"

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "cuda/attention/flash.cuh"
#include "cuda/common/arch.cuh"
#include "cuda/common/check.cuh"
#include "cuda/moe/moe.cuh"

namespace engine::cuda::arch {
namespace {

#ifdef ENGINE_SM90A
constexpr int kProbeThreads = 64;
#else
constexpr int kProbeThreads = 32;
#endif

__global__ void __launch_bounds__(kProbeThreads) arch_probe_kernel(int* out) {
#ifdef __CUDA_ARCH__
#ifdef ENGINE_SM90A
  constexpr int kSm90a = 1;
#else
  constexpr int kSm90a = 0;
#endif
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = __CUDA_ARCH__ / 10 * 2 + kSm90a;
#endif
}

Capability query(int dev) {
  Capability c;
  CUDA_CHECK(cudaDeviceGetAttribute(&c.device_major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&c.device_minor, cudaDevAttrComputeCapabilityMinor, dev));
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, arch_probe_kernel);
  // No code of this binary runs on the device (e.g. an sm_90a-only build on an A100): say so
  // now, naming the fix, rather than at the first kernel launch.
  ENSURE(err == cudaSuccess, "this binary has no code for the device (compute capability ",
         c.device_major, ".", c.device_minor, "): ", cudaGetErrorString(err),
         "; build for it with make SM=", c.device_major, c.device_minor);
  // ptxVersion is the loaded code's virtual architecture; a runtime that leaves it 0 gets the
  // cubin's (no PTX compilation by the driver can be told apart then).
  c.code_arch = attr.ptxVersion > 0 ? attr.ptxVersion : attr.binaryVersion;
  ENSURE(attr.maxThreadsPerBlock == 32 || attr.maxThreadsPerBlock == 64,
         "the capability probe kernel reports ", attr.maxThreadsPerBlock,
         " threads per block, expected 32 or 64 (cuda/common/arch.cu)");
  c.sm90a_code = attr.maxThreadsPerBlock == 64;
  c.from_ptx = attr.binaryVersion != c.code_arch;
  const bool sm90 = c.device_major >= 9 && c.code_arch >= 90;
  c.clusters = sm90;
  c.tma = sm90;
  c.pdl = sm90;
  c.wgmma = c.sm90a_code && c.device_major == 9 && c.device_minor == 0;
  return c;
}

}  // namespace

const Capability& current() {
  static std::mutex mu;
  static std::vector<std::unique_ptr<Capability>> known;  // by device ordinal
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(dev) >= known.size()) known.resize(static_cast<size_t>(dev) + 1);
  auto& slot = known[static_cast<size_t>(dev)];
  if (!slot) slot = std::make_unique<Capability>(query(dev));
  return *slot;
}

std::string describe(const Capability& c) {
  std::string s = str_cat("sm_", c.device_major, c.device_minor, " device, sm_", c.code_arch,
                          c.sm90a_code ? "a" : "", " code",
                          c.from_ptx ? " (PTX compiled by the driver)" : "");
  std::vector<std::string> have, lack;
  for (auto [name, on] : {std::pair{"clusters", c.clusters}, std::pair{"TMA", c.tma},
                          std::pair{"wgmma", c.wgmma}, std::pair{"PDL", c.pdl}})
    (on ? have : lack).push_back(name);
  auto join = [](const std::vector<std::string>& v, const char* last) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i)
      out += (i == 0 ? "" : i + 1 == v.size() ? last : ", ") + v[i];
    return out;
  };
  if (!have.empty()) s += ": " + join(have, ", ");
  if (!lack.empty()) s += (have.empty() ? ": no " : "; no ") + join(lack, " or ");
  return s;
}

std::string kernels_line() {
  const Capability& c = current();
  const bool sm90_attention = attention_sm90_available(64) || attention_sm90_available(128);
  return str_cat("kernels: ", describe(c), "; attention ",
                 sm90_attention ? "flash sm90 (wgmma, TMA)" : "flash mma.sync",
                 ", grouped GEMM ", grouped_hopper_available() ? "wgmma (TMA)" : "mma.sync",
                 ", loss rows ", c.clusters ? "clusters (bulk copies)" : "per warp / block",
                 ", launches ", c.pdl ? "programmatic dependent" : "plain");
}

int probe_on_device() {
  int* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, sizeof(int)));
  CUDA_CHECK(cudaMemset(d, 0xff, sizeof(int)));
  arch_probe_kernel<<<1, 1>>>(d);
  cudaError_t err = cudaGetLastError();
  int h = -1;
  if (err == cudaSuccess) err = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
  CUDA_CHECK(cudaFree(d));
  CUDA_CHECK(err);
  return h;
}

}  // namespace engine::cuda::arch
