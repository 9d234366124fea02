#include "layers/common.h"

namespace engine::layers {

std::vector<std::string> part_names(const std::string& prefix, const char* stem, std::initializer_list<const char*> parts,
                                    const char* suffix) {
  std::vector<std::string> out;
  for (const char* p : parts) out.push_back(prefix + "." + stem + p + suffix);
  return out;
}

Param adjacent_rows(const ParamStore& store, const std::vector<std::string>& names) {
  ENSURE(!names.empty(), "adjacent_rows of nothing");
  const ParamSpec& first = store.table().get(names[0]);
  int64_t rows = 0, cols = first.shape.ndim == 2 ? first.shape[1] : 1;
  int64_t expect = first.offset;
  for (const auto& n : names) {
    const ParamSpec& s = store.table().get(n);
    ENSURE(s.offset == expect && s.frozen == first.frozen, n, " is not adjacent to the parameter before it");
    ENSURE((s.shape.ndim == 2 ? s.shape[1] : 1) == cols, n, " has another column count");
    rows += s.shape[0];
    expect = s.offset + s.shape.numel();
  }
  Param p;
  p.store = &store;
  p.offset = first.offset;
  p.frozen = first.frozen;
  p.shape = first.shape.ndim == 2 ? Shape{rows, cols} : Shape{rows};
  return p;
}

}  // namespace engine::layers
