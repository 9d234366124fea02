// Text generation (train/generate.h): the sampling rules on a known distribution, seeded
// reproducibility, greedy decoding against the full forward, stops (end of document, context),
// the text codecs, and ./train --generate / training.sample_every end to end.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/common/process.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"
#include "tests/train/train_fixture.h"
#include "train/generate.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {

// ids 0..3 with probabilities 0.5, 0.1, 0.25, 0.15 (not in order, so the order is the code's).
std::vector<float> known_logits() {
  return {std::log(0.5f), std::log(0.1f), std::log(0.25f), std::log(0.15f)};
}

void check_distribution(const std::vector<std::pair<int32_t, double>>& got,
                        const std::vector<std::pair<int32_t, double>>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].first == want[i].first);
    CHECK(got[i].second == doctest::Approx(want[i].second).epsilon(1e-6));
  }
}

SamplingOptions opts(double temperature, int top_k = 0, double top_p = 1.0, int max_new = 16, uint64_t seed = 0) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.max_new_tokens = max_new;
  o.seed = seed;
  return o;
}

}  // namespace

TEST_CASE("sampling: temperature, top-k and top-p on a known distribution; greedy; the draw") {
  const std::vector<float> l = known_logits();
  check_distribution(sampling_distribution(l, opts(1)), {{0, 0.5}, {2, 0.25}, {3, 0.15}, {1, 0.1}});
  check_distribution(sampling_distribution(l, opts(1, 2)), {{0, 0.5 / 0.75}, {2, 0.25 / 0.75}});
  check_distribution(sampling_distribution(l, opts(1, 0, 0.7)), {{0, 0.5 / 0.75}, {2, 0.25 / 0.75}});
  check_distribution(sampling_distribution(l, opts(1, 0, 0.8)), {{0, 0.5 / 0.9}, {2, 0.25 / 0.9}, {3, 0.15 / 0.9}});
  check_distribution(sampling_distribution(l, opts(1, 0, 0.4)), {{0, 1.0}});  // at least one id
  check_distribution(sampling_distribution(l, opts(1, 3, 0.99)), {{0, 0.5 / 0.9}, {2, 0.25 / 0.9}, {3, 0.15 / 0.9}});
  // Temperature 2: p^(1/2), renormalised.
  const double s = std::sqrt(0.5) + std::sqrt(0.25) + std::sqrt(0.15) + std::sqrt(0.1);
  check_distribution(sampling_distribution(l, opts(2)),
                     {{0, std::sqrt(0.5) / s}, {2, 0.5 / s}, {3, std::sqrt(0.15) / s}, {1, std::sqrt(0.1) / s}});
  // The draw: the first id whose cumulative probability exceeds u.
  CHECK(pick_token(l, opts(1), 0.0) == 0);
  CHECK(pick_token(l, opts(1), 0.49) == 0);
  CHECK(pick_token(l, opts(1), 0.51) == 2);
  CHECK(pick_token(l, opts(1), 0.8) == 3);
  CHECK(pick_token(l, opts(1), 0.95) == 1);
  CHECK(pick_token(l, opts(1, 2), 0.7) == 2);
  CHECK(pick_token(l, opts(1, 1), 0.99) == 0);  // top-k 1 is greedy
  // Greedy: the largest logit, the lowest id among equals; u is not used.
  CHECK(pick_token(l, opts(0), 0.99) == 0);
  CHECK(pick_token(std::vector<float>{1.f, 3.f, 3.f, -1.f}, opts(0), 0.5) == 1);
  CHECK_THROWS_WITH_AS(pick_token(std::vector<float>{1.f, NAN}, opts(1), 0.5), doctest::Contains("NaN"), Error);
  CHECK_THROWS_WITH_AS(pick_token(std::vector<float>{NAN, 1.f}, opts(0), 0.5), doctest::Contains("NaN"), Error);
  // Uniforms: a pure function of (seed, index), in [0, 1).
  CHECK(sampling_uniform(7, 3) == sampling_uniform(7, 3));
  CHECK(sampling_uniform(7, 3) != sampling_uniform(8, 3));
  CHECK(sampling_uniform(7, 3) != sampling_uniform(7, 4));
  double mean = 0;
  for (int i = 0; i < 4000; ++i) {
    const double u = sampling_uniform(1, i);
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
    mean += u / 4000;
  }
  CHECK(mean == doctest::Approx(0.5).epsilon(0.05));
}

TEST_CASE("sampling: bad options are refused, naming the option") {
  CHECK_THROWS_WITH_AS(check_sampling(opts(-0.5)), doctest::Contains("--temperature"), Error);
  CHECK_THROWS_WITH_AS(check_sampling(opts(NAN)), doctest::Contains("--temperature"), Error);
  CHECK_THROWS_WITH_AS(check_sampling(opts(1, -1)), doctest::Contains("--top-k"), Error);
  CHECK_THROWS_WITH_AS(check_sampling(opts(1, 0, 0.0)), doctest::Contains("--top-p"), Error);
  CHECK_THROWS_WITH_AS(check_sampling(opts(1, 0, 1.5)), doctest::Contains("--top-p"), Error);
  CHECK_THROWS_WITH_AS(check_sampling(opts(1, 0, 1.0, 0)), doctest::Contains("--max-new-tokens"), Error);
  CHECK_NOTHROW(check_sampling(opts(0, 5, 1.0, 1)));
}

TEST_CASE("generate: greedy equals the argmax of the full forward; seeded sampling repeats; stops") {
  for (ModelFamily family : {ModelFamily::Llama, ModelFamily::Hybrid}) {
    CAPTURE(std::string(family_name(family)));
    ModelConfig c = tiny_model(family);
    auto model = make_model(c, Device::CPU, DType::F32);
    randomize_weights(model->params(), "generate");
    const std::vector<int32_t> prompt = {3, 14, 15, 9};
    const int64_t V = c.vocab_size, context = 20;
    const Generation g = generate(*model, prompt, opts(0, 0, 1.0, 8), {}, context, V);
    REQUIRE(g.tokens.size() == 8);
    CHECK_FALSE(g.stopped_at_eos);
    // Each greedy token is the argmax of the full forward's last row over the sequence so far.
    std::vector<int32_t> seq = prompt;
    for (int32_t next : g.tokens) {
      Sample s;
      s.tokens = seq;
      s.tokens.push_back(0);
      s.loss_mask.assign(seq.size(), 1);
      s.doc_lengths = {static_cast<int32_t>(seq.size())};
      MicroBatch mb = make_micro_batch({&s}, static_cast<int>(seq.size()), false, Device::CPU);
      Owned out = empty({static_cast<int64_t>(seq.size()), V}, DType::F32, Device::CPU);
      model->logits(mb, out);
      const std::span<const float> last(out.ptr<float>() + (seq.size() - 1) * V, static_cast<size_t>(V));
      CHECK(pick_token(last, opts(0), 0) == next);
      seq.push_back(next);
    }
    CHECK(generate(*model, prompt, opts(0, 0, 1.0, 8), {}, context, V).tokens == g.tokens);
    // Seeded sampling: the same seed gives the same tokens, another seed others.
    const auto a = generate(*model, prompt, opts(1.5, 0, 1.0, 12, 42), {}, context, V).tokens;
    const auto b = generate(*model, prompt, opts(1.5, 0, 1.0, 12, 42), {}, context, V).tokens;
    const auto d = generate(*model, prompt, opts(1.5, 0, 1.0, 12, 43), {}, context, V).tokens;
    CHECK(a == b);
    CHECK(a != d);
    // End of document: the greedy's third token as EOS stops before it (when not seen earlier).
    const int32_t eos = g.tokens[2];
    if (eos != g.tokens[0] && eos != g.tokens[1]) {
      const Generation e = generate(*model, prompt, opts(0, 0, 1.0, 8), {eos}, context, V);
      CHECK(e.stopped_at_eos);
      // Any of several stop ids (Llama 3 instruct models list more than one).
      CHECK(generate(*model, prompt, opts(0, 0, 1.0, 8), {-5, eos}, context, V).tokens == e.tokens);
      CHECK(e.tokens == std::vector<int32_t>(g.tokens.begin(), g.tokens.begin() + 2));
    }
    // The context: a new token is picked from each position the model takes.
    const Generation full = generate(*model, prompt, opts(0, 0, 1.0, 8), {}, 6, V);
    CHECK(full.stopped_at_context);
    CHECK(full.tokens == std::vector<int32_t>(g.tokens.begin(), g.tokens.begin() + 3));
    // Ids past allowed_vocab are never picked.
    for (int32_t t : generate(*model, prompt, opts(2, 0, 1.0, 12, 5), {}, context, 16).tokens) CHECK(t < 16);
    CHECK_THROWS_WITH_AS(generate(*model, std::vector<int32_t>(20, 1), opts(0), {}, 20, V),
                         doctest::Contains("no room for a new token"), Error);
    CHECK_THROWS_WITH_AS(generate(*model, std::vector<int32_t>{}, opts(0), {}, 20, V),
                         doctest::Contains("empty prompt"), Error);
  }
}

TEST_CASE("text codecs: token ids, byte level, the automatic choice") {
  Config c = tiny_run_config("llama");  // vocab 37: ids
  TextCodec ids = make_text_codec(c);
  CHECK_FALSE(ids.tokenizer);
  CHECK(ids.encode("1, 2 3,4") == std::vector<int32_t>{1, 2, 3, 4});
  CHECK(ids.decode(std::vector<int32_t>{5, 6}) == "5 6");
  CHECK(ids.stop_ids().empty());
  CHECK_THROWS_WITH_AS(ids.encode("1,x"), doctest::Contains("'x' is not a token id"), Error);
  CHECK_THROWS_WITH_AS(ids.encode("37"), doctest::Contains("[0, 37)"), Error);
  CHECK_THROWS_WITH_AS(ids.encode(" , "), doctest::Contains("prompt is empty"), Error);
  Config b = tiny_run_config("llama", {"model.vocab_size=257"});
  TextCodec bytes = make_text_codec(b);
  REQUIRE(bytes.tokenizer);
  CHECK(bytes.encode("ab") == std::vector<int32_t>{97, 98});
  CHECK(bytes.stop_ids() == std::vector<int32_t>{256});
  CHECK(bytes.decode(std::vector<int32_t>{104, 105, 256}) == "hi");
  CHECK(make_text_codec(tiny_run_config("llama", {"model.vocab_size=300", "data.tokenizer=\"bytes\""})).vocab == 257);
  CHECK_FALSE(make_text_codec(tiny_run_config("llama", {"model.vocab_size=257", "data.tokenizer=\"ids\""})).tokenizer);
  CHECK_THROWS_WITH_AS(tiny_run_config("llama", {"data.tokenizer=\"bytes\""}), doctest::Contains("data.tokenizer"),
                       Error);
  CHECK_THROWS_WITH_AS(tiny_run_config("llama", {"data.tokenizer=\"/nonexistent/tok.json\""}),
                       doctest::Contains("/nonexistent/tok.json does not exist"), Error);
  CHECK_THROWS_WITH_AS(tiny_run_config("llama", {"training.sample_every=2"}),
                       doctest::Contains("training.sample_prompt"), Error);
  CHECK_THROWS_WITH_AS(tiny_run_config("llama", {"training.sample_every=2", "training.sample_prompt=\"1\"",
                                                 "distributed.zero_stage=3"}),
                       doctest::Contains("training.sample_every"), Error);
}

TEST_CASE("training.sample_every: the samples leave training bitwise unchanged") {
  Config plain = tiny_run_config("mistral", {"training.steps=6", "model.sliding_window=5"});
  Config sampled = tiny_run_config("mistral", {"training.steps=6", "model.sliding_window=5", "training.sample_every=2",
                                               "training.sample_prompt=\"1,2,3\"", "training.sample_tokens=5"});
  Trainer a(plain, false), b(sampled, false);
  CHECK(a.run() == 0);
  CHECK(b.run() == 0);
  const Tensor wa = a.model().params().weights_flat(), wb = b.model().params().weights_flat();
  REQUIRE(wa.numel() == wb.numel());
  CHECK(std::memcmp(wa.data, wb.data, static_cast<size_t>(wa.numel()) * dtype_size(wa.dtype)) == 0);
}
