// The capability layer (host side): what the current device can do and what this binary's code
// for it was compiled with, asked once per device and cached. Every kernel choice that depends
// on Hopper-only features (thread-block clusters, TMA and bulk copies, wgmma, programmatic
// dependent launch) asks here, so a build without sm_90a code never selects a Hopper kernel, even
// on an H200 (there the driver runs the binary's PTX for an older architecture, compiled at load
// time, whose Hopper kernel bodies are empty). Device-side feature macros: arch.cuh.
// Plain C++ declarations: includable from g++-built files (the run log, the tests).
#pragma once
#include <string>

namespace engine::cuda::arch {

struct Capability {
  int device_major = 0, device_minor = 0;  // the device's compute capability
  // The code of this binary the driver runs on the device: the virtual architecture it was
  // compiled from (__CUDA_ARCH__ / 10: 80, 86, 89, 90), whether that is sm_90a code (wgmma and
  // setmaxnreg compiled in), and whether the driver compiled it from PTX at load (no cubin of
  // this binary fits the device).
  int code_arch = 0;
  bool sm90a_code = false;
  bool from_ptx = false;
  // Features a kernel choice may use: the device has them and the running code has them
  // compiled in. clusters, tma (cp.async.bulk and its tensor form, mbarrier transaction counts)
  // and pdl (griddepcontrol): compute capability 9 and code for sm_90 or later; wgmma: sm_90a
  // code on a compute capability 9.0 device.
  bool clusters = false, tma = false, pdl = false, wgmma = false;
};

// The current device's capability (cudaGetDevice), queried on first use and cached per device.
// The query reads kernel attributes only (no launch): safe during stream capture.
const Capability& current();

// "sm_90 device, sm_90a code: clusters, TMA, wgmma, PDL" or "sm_90 device, sm_80 code (PTX
// compiled by the driver): no clusters, TMA, wgmma or PDL".
std::string describe(const Capability& c);

// The kernels an Auto run uses on the current device, one line for the run log: attention,
// grouped GEMM, the loss kernels' row paths, launches.
std::string kernels_line();

// Runs the probe kernel and returns what its code wrote: __CUDA_ARCH__ / 10 * 2, plus 1 where
// sm_90a features were compiled in (the tests check current() against it; synchronises).
int probe_on_device();

}  // namespace engine::cuda::arch
