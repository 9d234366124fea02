#include "layers/common.h"

namespace engine::layers {

Param adjacent_rows(const ParamStore& store, const std::vector<std::string>& names) {
  ENSURE(!names.empty(), "adjacent_rows of nothing");
  const ParamSpec& first = store.table().get(names[0]);
  int64_t rows = 0, cols = first.shape.ndim == 2 ? first.shape[1] : 1;
  int64_t expect = first.offset;
  for (const auto& n : names) {
    const ParamSpec& s = store.table().get(n);
    ENSURE(s.offset == expect, n, " is not adjacent to the parameter before it");
    ENSURE((s.shape.ndim == 2 ? s.shape[1] : 1) == cols, n, " has another column count");
    rows += s.shape[0];
    expect = s.offset + s.shape.numel();
  }
  Param p;
  Tensor w0 = store.weight(names[0]), g0 = store.grad(names[0]);
  Shape shape = first.shape.ndim == 2 ? Shape{rows, cols} : Shape{rows};
  p.w = Tensor(w0.data, w0.dtype, w0.device, shape);
  p.g = Tensor(g0.data, g0.dtype, g0.device, shape);
  return p;
}

}  // namespace engine::layers
