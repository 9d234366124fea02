#include <cmath>

#include "checkpoint/checkpoint.h"

namespace engine::checkpoint {

void require_finite(const float* values, int64_t n, int64_t lo, const std::string& param, const std::string& source) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(values[i]))
      RAISE(source, ": ", param, ": element ", lo + i, " is ", values[i],
            ": weights and optimizer state read from a checkpoint or a Hugging Face folder must be finite");
}

}  // namespace engine::checkpoint
