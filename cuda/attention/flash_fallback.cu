// Launchers of the f32 fallback kernels (flash_fallback.cuh): one warp per row, 4 rows a block.
#include "cuda/attention/flash_fallback.cuh"
#include "cuda/common/launch.cuh"

namespace engine::cuda::flash {
namespace {

dim3 row_grid(const Params& p, int heads) {
  return dim3(static_cast<unsigned>(ceil_div(p.max_seqlen, fallback::kWarps)),
              static_cast<unsigned>(heads), static_cast<unsigned>(p.num_seqs));
}

}  // namespace

void run_fallback_fwd(const Params& p, cudaStream_t stream) {
  fallback::fallback_fwd_kernel<<<row_grid(p, p.num_heads), fallback::kWarps * 32, 0, stream>>>(p);
  check_launch("fallback_fwd_kernel");
}

void run_fallback_bwd(const Params& p, cudaStream_t stream) {
  fallback::fallback_bwd_dq_kernel<<<row_grid(p, p.num_heads), fallback::kWarps * 32, 0,
                                     stream>>>(p);
  check_launch("fallback_bwd_dq_kernel");
  fallback::fallback_bwd_dkv_kernel<<<row_grid(p, p.num_kv_heads), fallback::kWarps * 32, 0,
                                      stream>>>(p);
  check_launch("fallback_bwd_dkv_kernel");
}

}  // namespace engine::cuda::flash
