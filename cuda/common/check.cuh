// CUDA_CHECK(expr): the failing call as text, the CUDA error string, file:line and the rank
// (through engine::fail_check). Used by every launcher after its launch as well.
#pragma once
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(expr)                                                                   \
  do {                                                                                     \
    cudaError_t cuda_check_err_ = (expr);                                                  \
    if (cuda_check_err_ != cudaSuccess) [[unlikely]]                                       \
      ::engine::fail_check(__FILE__, __LINE__, #expr,                                      \
                           ::engine::str_cat("CUDA error: ",                               \
                                             cudaGetErrorString(cuda_check_err_)));        \
  } while (0)
