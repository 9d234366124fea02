// Launchers of the f32 fallback kernels (flash_fallback.cuh): one warp per row, 4 rows a block.
#include "cuda/attention/flash_fallback.cuh"
#include "cuda/common/launch.cuh"

namespace engine::cuda::flash {
namespace {

// A warp per row of up to max_len rows (queries or keys) of each sequence and head.
dim3 row_grid(const Grid& g, int max_len, int heads) {
  return dim3(static_cast<unsigned>(ceil_div(max_len, fallback::kWarps)),
              static_cast<unsigned>(heads), static_cast<unsigned>(g.num_seqs));
}

}  // namespace

void run_fallback_fwd(const Params& p, const Grid& g, cudaStream_t stream) {
  const dim3 grid = row_grid(g, g.max_seqlen_q, p.num_heads);
  fallback::fallback_fwd_kernel<<<grid, fallback::kWarps * 32, 0, stream>>>(p);
  check_launch("fallback_fwd_kernel");
}

void run_fallback_bwd(const Params& p, const Grid& g, cudaStream_t stream) {
  const dim3 dq_grid = row_grid(g, g.max_seqlen_q, p.num_heads);
  fallback::fallback_bwd_dq_kernel<<<dq_grid, fallback::kWarps * 32, 0, stream>>>(p);
  check_launch("fallback_bwd_dq_kernel");
  const dim3 dkv_grid = row_grid(g, g.max_seqlen_k, p.num_kv_heads);
  fallback::fallback_bwd_dkv_kernel<<<dkv_grid, fallback::kWarps * 32, 0, stream>>>(p);
  check_launch("fallback_bwd_dkv_kernel");
}

}  // namespace engine::cuda::flash
