// The cuDNN backend-API helpers of cudnn_graph.cuh that are not inline: status checks, the
// library version and the per-device handles.
#ifdef ENGINE_CUDNN
#include "cuda/attention/cudnn_graph.cuh"

#include <map>
#include <mutex>

#include "cuda/common/launch.cuh"

namespace engine::cuda::cudnn {

void check(cudnnStatus_t s, const std::string& context, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) [[likely]]
    return;
  char last[2048] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  RAISE("cuDNN attention (model.attention_backend = \"cudnn\"): ", context, ": ", what, ": ",
        cudnnGetErrorString(s), last[0] ? " (" : "", last, last[0] ? ")" : "");
}

std::string version_string() {
  const size_t v = cudnnGetVersion();  // major * 10000 + minor * 100 + patch
  return str_cat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

cudnnHandle_t handle() {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mutex);
  cudnnHandle_t& h = handles[dev];
  if (!h) check(cudnnCreate(&h), str_cat("device ", dev), "cudnnCreate");
  check(cudnnSetStream(h, stream()), "handle", "cudnnSetStream");
  return h;
}

}  // namespace engine::cuda::cudnn

#endif  // ENGINE_CUDNN
