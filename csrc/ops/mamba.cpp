// Dispatch of ops/mamba.h: CPU -> ref/mamba, CUDA -> cuda/mamba (conv1d.cu, scan.cu).
#include "ops/mamba.h"

#include "ops/dispatch.h"
#include "ref/mamba.h"

#ifdef ENGINE_CUDA
#include "cuda/mamba/conv1d.cuh"
#include "cuda/mamba/scan.cuh"
#endif

namespace engine::ops {

void causal_conv1d_forward(const ColumnBlock& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& cu_seqlens, bool silu, const ColumnBlock& y) {
  if (device_of("causal_conv1d_forward", {{"x", x.base},
                                          {"weight", weight},
                                          {"bias", bias},
                                          {"cu_seqlens", cu_seqlens},
                                          {"y", y.base}}) == Device::CPU)
    return ref::causal_conv1d_forward(x, weight, bias, cu_seqlens, silu, y);
#ifdef ENGINE_CUDA
  return cuda::causal_conv1d_forward(x, weight, bias, cu_seqlens, silu, y);
#endif
  no_cuda_build("causal_conv1d_forward");
}

void causal_conv1d_backward(const ColumnBlock& dy, const ColumnBlock& x, const Tensor& weight,
                            const Tensor& bias, const Tensor& cu_seqlens, bool silu,
                            const ColumnBlock& dx, const Tensor& dweight, const Tensor& dbias) {
  if (device_of("causal_conv1d_backward", {{"dy", dy.base},
                                           {"x", x.base},
                                           {"weight", weight},
                                           {"bias", bias},
                                           {"cu_seqlens", cu_seqlens},
                                           {"dx", dx.base},
                                           {"dweight", dweight},
                                           {"dbias", dbias}}) == Device::CPU)
    return ref::causal_conv1d_backward(dy, x, weight, bias, cu_seqlens, silu, dx, dweight, dbias);
#ifdef ENGINE_CUDA
  return cuda::causal_conv1d_backward(dy, x, weight, bias, cu_seqlens, silu, dx, dweight, dbias);
#endif
  no_cuda_build("causal_conv1d_backward");
}

namespace {
Device scan_device(const char* op, const ScanArgs& a, const Tensor& chunk_states) {
  return device_of(op, {{"x", a.x.base},
                        {"dt", a.dt},
                        {"A_log", a.A_log},
                        {"B", a.B.base},
                        {"C", a.C.base},
                        {"D", a.D},
                        {"dt_bias", a.dt_bias},
                        {"z", a.z.base},
                        {"cu_seqlens", a.cu_seqlens},
                        {"chunk_states", chunk_states}});
}
}  // namespace

void selective_scan_forward(const ScanArgs& a, const ColumnBlock& y, const Tensor& chunk_states) {
  const Device dev = scan_device("selective_scan_forward", a, chunk_states);
  device_of("selective_scan_forward", {{"x", a.x.base}, {"y", y.base}});
  if (dev == Device::CPU) return ref::selective_scan_forward(a, y, chunk_states);
#ifdef ENGINE_CUDA
  return cuda::selective_scan_forward(a, y, chunk_states);
#endif
  no_cuda_build("selective_scan_forward");
}

void selective_scan_backward(const ScanArgs& a, const ColumnBlock& dy, const Tensor& chunk_states,
                             const ScanGrads& g) {
  const Device dev = scan_device("selective_scan_backward", a, chunk_states);
  device_of("selective_scan_backward", {{"x", a.x.base},
                                        {"dy", dy.base},
                                        {"dx", g.dx.base},
                                        {"ddt", g.ddt},
                                        {"dB", g.dB.base},
                                        {"dC", g.dC.base},
                                        {"dz", g.dz.base},
                                        {"dA_log", g.dA_log},
                                        {"dD", g.dD},
                                        {"ddt_bias", g.ddt_bias}});
  if (dev == Device::CPU) return ref::selective_scan_backward(a, dy, chunk_states, g);
#ifdef ENGINE_CUDA
  return cuda::selective_scan_backward(a, dy, chunk_states, g);
#endif
  no_cuda_build("selective_scan_backward");
}

}  // namespace engine::ops
