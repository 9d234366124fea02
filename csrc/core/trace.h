// Named ranges for GPU profilers (Nsight Systems: `nsys profile ./bench train CONFIG`): a
// TraceRange marks its scope on the timeline with NVTX (the header-only nvtx3 of the CUDA
// toolkit; without a profiler attached a push or pop is a check of one pointer). CPU-only builds
// compile it to nothing.
#pragma once
#include <string>

#ifdef ENGINE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace engine {

class TraceRange {
 public:
  explicit TraceRange(const char* name) {
#ifdef ENGINE_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  explicit TraceRange(const std::string& name) : TraceRange(name.c_str()) {}
  ~TraceRange() {
#ifdef ENGINE_CUDA
    nvtxRangePop();
#endif
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

}  // namespace engine
