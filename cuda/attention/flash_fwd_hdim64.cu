// One instantiation per file so builds parallelise: flash attention forward, head dim 64
// (the kernel and its tiles are described in flash_fwd.cuh).
#include "cuda/attention/flash_fwd.cuh"

namespace engine::cuda::flash {
template void run_flash_fwd<64>(const Params&, const Grid&, cudaStream_t);
}  // namespace engine::cuda::flash
