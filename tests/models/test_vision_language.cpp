// A vision-language model (ModelConfig::vision, models/transformer.h) on the CPU in fp64: the
// encoder's features replace the image tokens' input embeddings; every parameter's gradient
// (encoder, projector and text model, vision width 16 against text width 14) against finite
// differences; the image token's embedding row gets no gradient; the loss moves with the pixels;
// two sequences with their images packed in one micro-batch give each one's loss and gradients
// as alone. The micro-batches are built here (the data path carries no images yet).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "models/model.h"
#include "tests/common/gradcheck.h"
#include "tests/common/tiny.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr int32_t kSeq = 12;

ModelConfig tiny_vlm() {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  c.vision.channels = 3;
  c.vision.patch_size = 2;
  c.vision.width = 16;  // 2 heads of 8; the text model's width is 14
  c.vision.layers = 1;
  c.vision.heads = 2;
  c.vision.ffn = 20;
  return c;
}

// One image of rows x cols patches at token rows [first, first + rows cols) of its sequence.
struct Image {
  int rows, cols, first;
};

// A sequence of kSeq tokens whose image rows hold the image token (the vocabulary's last id, used
// nowhere else) and whose labels that are image tokens carry no loss, as a data path sets them.
Sample image_sample(const std::vector<Image>& images, int vocab, const std::string& name) {
  Sample s = make_sample({kSeq}, vocab, name);
  const int32_t image_token = vocab - 1;
  for (int32_t& t : s.tokens)
    if (t == image_token) t = 0;
  for (const Image& im : images)
    for (int i = 0; i < im.rows * im.cols; ++i) s.tokens[static_cast<size_t>(im.first + i)] = image_token;
  for (int32_t t = 0; t < kSeq; ++t)
    if (s.tokens[static_cast<size_t>(t) + 1] == image_token) s.loss_mask[static_cast<size_t>(t)] = 0;
  return s;
}

// The micro-batch of `samples` (sequence b at rows b kSeq ..) with images[b]'s patches: random
// pixels drawn per (sequence name, image), so a sequence's pixels do not depend on what is packed
// beside it.
MicroBatch image_batch(const std::vector<const Sample*>& samples, const std::vector<std::vector<Image>>& images,
                       const std::vector<std::string>& names, const ModelConfig& c) {
  MicroBatch mb = make_micro_batch(samples, kSeq, false, Device::CPU);
  const int64_t in = int64_t{c.vision.channels} * c.vision.patch_size * c.vision.patch_size;
  std::vector<Owned> pixels;
  std::vector<int32_t> cu{0}, pos, rows;
  int max_patches = 0;
  for (size_t b = 0; b < samples.size(); ++b)
    for (size_t i = 0; i < images[b].size(); ++i) {
      const Image& im = images[b][i];
      pixels.push_back(randn({int64_t{im.rows} * im.cols, in}, DType::F64, names[b] + ".pixels" + std::to_string(i)));
      for (int r = 0; r < im.rows; ++r)
        for (int q = 0; q < im.cols; ++q) {
          pos.push_back(r);
          pos.push_back(q);
          rows.push_back(static_cast<int32_t>(b) * kSeq + im.first + r * im.cols + q);
        }
      cu.push_back(cu.back() + im.rows * im.cols);
      max_patches = std::max(max_patches, im.rows * im.cols);
    }
  const int64_t P = cu.back();
  mb.patches = empty({P, in}, DType::F64, Device::CPU);
  for (int64_t i = 0, at = 0; i < static_cast<int64_t>(pixels.size()); at += pixels[static_cast<size_t>(i)]->numel(), ++i)
    std::copy(pixels[static_cast<size_t>(i)].ptr<double>(),
              pixels[static_cast<size_t>(i)].ptr<double>() + pixels[static_cast<size_t>(i)]->numel(),
              mb.patches.ptr<double>() + at);
  mb.image_cu = empty({static_cast<int64_t>(cu.size())}, DType::I32, Device::CPU);
  std::copy(cu.begin(), cu.end(), mb.image_cu.ptr<int32_t>());
  mb.patch_positions = empty({P, 2}, DType::I32, Device::CPU);
  std::copy(pos.begin(), pos.end(), mb.patch_positions.ptr<int32_t>());
  mb.image_rows = empty({P, 1}, DType::I32, Device::CPU);
  std::copy(rows.begin(), rows.end(), mb.image_rows.ptr<int32_t>());
  mb.max_image_patches = max_patches;
  return mb;
}

double run(Model& model, const MicroBatch& mb, float scale, bool backward) {
  auto saved = model.new_saved();
  const double loss = model.forward(mb, *saved, true, scale);
  if (backward) model.backward(mb, *saved);
  return loss;
}

}  // namespace

TEST_CASE("vision-language model: gradients of encoder, projector and text model match fp64 finite differences") {
  const ModelConfig c = tiny_vlm();
  auto model = make_model(c, Device::CPU, DType::F64);
  randomize_weights(model->params(), "vlm");
  const std::vector<Image> images{{2, 3, 1}, {1, 2, 8}};  // 6 + 2 patches
  Sample s = image_sample(images, c.vocab_size, "vlm.s");
  MicroBatch mb = image_batch({&s}, {images}, {"vlm.s"}, c);
  const float scale = 1.f / static_cast<float>(mb.loss_tokens);
  model->params().zero_grads();
  run(*model, mb, scale, true);
  Owned grads = empty(model->params().grads_flat().shape, DType::F64, Device::CPU);
  copy_tensor(grads, model->params().grads_flat());
  auto loss = [&] { return scale * run(*model, mb, scale, false); };
  auto cmp = finite_difference_check(loss, model->params().weights_flat(), grads, "vlm", 800, 1e-6);
  INFO(cmp.report);
  CHECK(cmp.rel_rms < 1e-6);

  // The vision parameters come first and have gradients; the image token's embedding row has none.
  const ParamTable& t = model->params().table();
  CHECK(t.entries().front().name.rfind("vision.", 0) == 0);
  const ParamSpec& emb = t.get("embed.tokens");
  double image_row = 0, vision = 0;
  for (int64_t j = 0; j < c.hidden_size; ++j)
    image_row += std::fabs(get(grads, emb.offset + int64_t{c.vocab_size - 1} * c.hidden_size + j));
  for (const ParamSpec& p : t.entries())
    if (p.name.rfind("vision.", 0) == 0)
      for (int64_t i = 0; i < p.shape.numel(); ++i) vision += std::fabs(get(grads, p.offset + i));
  CHECK(image_row == 0);
  CHECK(vision > 0);

  // The loss moves with an image's pixels.
  const double before = loss();
  set(mb.patches, 7, get(mb.patches, 7) + 0.5);
  CHECK(std::fabs(loss() - before) > 1e-9);
}

TEST_CASE("vision-language model: two sequences with their images packed give each one's loss and gradients") {
  const ModelConfig c = tiny_vlm();
  auto model = make_model(c, Device::CPU, DType::F64);
  randomize_weights(model->params(), "vlm.pack");
  const std::vector<Image> ia{{2, 3, 2}}, ib{{1, 2, 5}, {2, 2, 7}};
  Sample a = image_sample(ia, c.vocab_size, "vlm.a"), b = image_sample(ib, c.vocab_size, "vlm.b");
  const MicroBatch ma = image_batch({&a}, {ia}, {"vlm.a"}, c), mb = image_batch({&b}, {ib}, {"vlm.b"}, c);
  const MicroBatch both = image_batch({&a, &b}, {ia, ib}, {"vlm.a", "vlm.b"}, c);
  const float scale = 0.25f;
  const int64_t n = model->params().grads_flat().numel();
  Owned alone = zeros({n}, DType::F64, Device::CPU);
  model->params().zero_grads();
  const double la = run(*model, ma, scale, true);
  const double lb = run(*model, mb, scale, true);  // (gradients add over the two)
  copy_tensor(alone, model->params().grads_flat());
  model->params().zero_grads();
  const double lab = run(*model, both, scale, true);
  CHECK(lab == doctest::Approx(la + lb).epsilon(1e-12));
  CHECK_CLOSE(model->params().grads_flat(), alone, 1e-10);
}

TEST_CASE("vision-language model: refusals name the problem") {
  ModelConfig c = tiny_model(ModelFamily::Llama);
  auto text = make_model(c, Device::CPU, DType::F64);
  const std::vector<Image> images{{1, 2, 3}};
  Sample s = image_sample(images, c.vocab_size, "vlm.refuse");
  c.vision = tiny_vlm().vision;
  MicroBatch mb = image_batch({&s}, {images}, {"vlm.refuse"}, c);
  auto saved = text->new_saved();
  CHECK_THROWS_WITH_AS(text->forward(mb, *saved, true, 1.f), doctest::Contains("no vision encoder"), Error);
  auto vlm = make_model(c, Device::CPU, DType::F64);
  mb.image_rows = empty({2, 2}, DType::I32, Device::CPU);
  auto saved2 = vlm->new_saved();
  CHECK_THROWS_WITH_AS(vlm->forward(mb, *saved2, true, 1.f), doctest::Contains("image_rows"), Error);
}
