// Dispatch of ops/embedding.h: CPU -> ref/embedding, CUDA -> cuda/embedding.
#include "ops/embedding.h"

#include "ops/dispatch.h"
#include "ref/embedding.h"

#ifdef ENGINE_CUDA
#include "cuda/embedding/embedding.cuh"
#endif

namespace engine::ops {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_begin, int64_t vocab_total, IdCheck check) {
  if (device_of("embedding_forward", {{"ids", ids}, {"table", table}, {"out", out}}) == Device::CPU)
    return ref::embedding_forward(ids, table, out, accumulate, vocab_begin, vocab_total);
#ifdef ENGINE_CUDA
  return cuda::embedding_forward(ids, table, out, accumulate, vocab_begin, vocab_total,
                                 check == IdCheck::kRaise);
#endif
  no_cuda_build("embedding_forward");
}

void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_begin, int64_t vocab_total, IdCheck check) {
  if (device_of("embedding_backward", {{"ids", ids}, {"dout", dout}, {"dtable", dtable}}) ==
      Device::CPU)
    return ref::embedding_backward(ids, dout, dtable, vocab_begin, vocab_total);
#ifdef ENGINE_CUDA
  return cuda::embedding_backward(ids, dout, dtable, vocab_begin, vocab_total,
                                  check == IdCheck::kRaise);
#endif
  no_cuda_build("embedding_backward");
}

}  // namespace engine::ops
