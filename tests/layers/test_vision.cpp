// The vision encoder (layers/vision.h) on the CPU in fp64: every parameter gradient against
// finite differences, over two images of different sizes, with the encoder's width, the MLP's
// and the text width all different; no patch's features move with another image's pixels.
#include <doctest/doctest.h>

#include <cmath>

#include "layers/vision.h"
#include "tests/common/gradcheck.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

const layers::Env kEnv{Device::CPU, DType::F64};

layers::VisionConfig tiny_vision() {
  layers::VisionConfig v;
  v.channels = 3;
  v.patch_size = 2;
  v.width = 16;  // 2 heads of 8
  v.layers = 2;
  v.heads = 2;
  v.ffn = 20;
  v.text_width = 12;
  return v;
}

}  // namespace

TEST_CASE("vision encoder (Pixtral blocks, Llava projector): parameter gradients match fp64 finite differences") {
  const layers::VisionConfig v = tiny_vision();
  ParamTable t;
  layers::VisionEncoder::declare(t, "vision", v);
  ParamStore store(t, Device::CPU, DType::F64);
  randomize_weights(store, "vision");
  layers::VisionEncoder enc(store, "vision", v);
  TwoImages im = two_images();
  const int64_t in = int64_t{v.channels} * v.patch_size * v.patch_size;
  Owned patches = randn({8, in}, DType::F64, "vision.patches"), r = randn({8, v.text_width}, DType::F64, "vision.r");
  Owned f = empty({8, v.text_width}, DType::F64, Device::CPU);
  layers::VisionSaved saved;
  auto loss = [&] {
    enc.forward(kEnv, patches, im.seg, saved, f);
    return dot(f, r);
  };
  store.zero_grads();
  loss();
  enc.backward(kEnv, r, patches, im.seg, saved);
  auto cw = finite_difference_check(loss, store.weights_flat(), store.grads_flat(), "vision dparams", 600);
  INFO(cw.report);
  CHECK(cw.rel_rms < 1e-6);

  // Images are separate sequences: the first image's features do not move with the second's
  // patches, and do move with its own last patch.
  Owned f0 = empty({8, v.text_width}, DType::F64, Device::CPU);
  loss();
  copy_tensor(f0, f);
  patches.ptr<double>()[6 * in] += 0.5;
  loss();
  double other = 0;
  for (int64_t j = 0; j < 6 * v.text_width; ++j) other += std::fabs(get(f, j) - get(f0, j));
  CHECK(other == 0);
  patches.ptr<double>()[6 * in] -= 0.5;
  patches.ptr<double>()[5 * in] += 0.5;
  loss();
  double own = 0;
  for (int64_t j = 0; j < v.text_width; ++j) own += std::fabs(get(f, j) - get(f0, j));
  CHECK(own > 1e-6);
}

TEST_CASE("vision encoder: sizes it cannot build are refused, naming them") {
  layers::VisionConfig v = tiny_vision();
  v.heads = 3;  // 16 is not whole heads of 3
  ParamTable t;
  CHECK_THROWS_WITH_AS(layers::VisionEncoder::declare(t, "vision", v), doctest::Contains("multiple of 4"), Error);
  v = tiny_vision();
  v.width = 24;
  v.heads = 4;  // heads of 6: not a multiple of 4 (the 2-D RoPE's quarters)
  ParamTable t2;
  CHECK_THROWS_WITH_AS(layers::VisionEncoder::declare(t2, "vision", v), doctest::Contains("width 24"), Error);
}
