// One instantiation per file so builds parallelise: flash attention backward, head dim 128
// (the kernel and its tiles are described in flash_bwd.cuh).
#include "cuda/attention/flash_bwd.cuh"

namespace engine::cuda::flash {
template void run_flash_bwd<128>(const Params&, const Grid&, cudaStream_t);
}  // namespace engine::cuda::flash
