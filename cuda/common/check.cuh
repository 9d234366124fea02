// CUDA_CHECK(expr): the failing call as text, the CUDA error string, file:line and the rank
// (through engine::fail_check). Used by every launcher after its launch as well.
// CUDA_CHECK_GEN builds the check for any library whose calls return a status (cuBLAS:
// CUBLAS_CHECK in cuda/gemm/gemm.cu): the status that means success, the library's name for
// the message and its status-to-string function.
#pragma once
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK_GEN(expr, text, ok, library, to_string)                                 \
  do {                                                                                     \
    const auto cuda_check_status_ = (expr);                                                \
    if (cuda_check_status_ != (ok)) [[unlikely]]                                           \
      ::engine::fail_check(__FILE__, __LINE__, text,                                       \
                           ::engine::str_cat(library " error: ",                           \
                                             to_string(cuda_check_status_)));              \
  } while (0)

#define CUDA_CHECK(expr) CUDA_CHECK_GEN((expr), #expr, cudaSuccess, "CUDA", cudaGetErrorString)
