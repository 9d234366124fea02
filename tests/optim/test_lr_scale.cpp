// optimizer.lr_scale (optim/lr_scale.h): glob patterns, last match wins, scale 0 leaves a
// parameter unchanged, 0.5 halves the first Adam step's update, and the refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "optim/lr_scale.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;

namespace {
Owned host_copy(const Tensor& t) {
  Owned h = empty(t.shape, t.dtype, Device::CPU);
  copy_tensor(h, t);
  return h;
}
}  // namespace

TEST_CASE("lr_scale: glob patterns over parameter names; the last matching entry wins") {
  CHECK(glob_match("layers.*.attn.*", "layers.10.attn.wq"));
  CHECK(glob_match("*", "embed.tokens"));
  CHECK(glob_match("embed.*", "embed.tokens"));
  CHECK(glob_match("*.lora_a", "layers.0.mlp.w_up.lora_a"));
  CHECK(glob_match("layers.1*", "layers.12.norm1.weight"));
  CHECK(glob_match("a*b*c", "aXXbYYbc"));
  CHECK_FALSE(glob_match("layers.*.attn.*", "layers.1.mlp.w_up"));
  CHECK_FALSE(glob_match("embed.tokens", "embed.tokens2"));
  CHECK_FALSE(glob_match("embed.tokens", "xembed.tokens"));
  CHECK_FALSE(glob_match("a*b", "aXbY"));
  OptimizerConfig o;
  o.lr_scale = {{"layers.*", 0.5}, {"layers.1.*", 2.0}, {"embed.*", 0.0}};
  CHECK(lr_scale_of(o, "layers.0.attn.wq") == 0.5);
  CHECK(lr_scale_of(o, "layers.1.attn.wq") == 2.0);
  CHECK(lr_scale_of(o, "embed.tokens") == 0.0);
  CHECK(lr_scale_of(o, "final_norm.weight") == 1.0);
}

TEST_CASE("lr_scale: 0 leaves the matched parameters unchanged; 0.5 halves the first step's update") {
  const std::string scales =
      "optimizer.lr_scale=[{ pattern = \"layers.0.*\", scale = 0.0 }, { pattern = \"layers.1.attn.*\", scale = 0.5 }]";
  Trainer full(tiny_run_config("llama"), false), scaled(tiny_run_config("llama", {scales}), false);
  const ParamTable& t = scaled.model().params().table();
  const Owned w0 = host_copy(scaled.model().params().weights_flat());
  full.train_step();
  scaled.train_step();
  const Owned wf = host_copy(full.model().params().weights_flat()), ws = host_copy(scaled.model().params().weights_flat());
  int halved = 0;
  for (const ParamSpec& p : t.entries()) {
    CAPTURE(p.name);
    double dmax = 0, err = 0;
    for (int64_t i = p.offset; i < p.offset + p.shape.numel(); ++i) {
      const double d_full = get(wf, i) - get(w0, i), d_scaled = get(ws, i) - get(w0, i);
      if (p.name.rfind("layers.0.", 0) == 0) {
        dmax = std::max(dmax, std::abs(d_scaled));
      } else if (p.name.rfind("layers.1.attn.", 0) == 0) {
        err = std::max(err, std::abs(d_scaled - 0.5 * d_full));
        dmax = std::max(dmax, std::abs(d_full));
      } else {
        err = std::max(err, std::abs(d_scaled - d_full));
      }
    }
    if (p.name.rfind("layers.0.", 0) == 0) {
      CHECK(dmax == 0);  // bitwise unchanged
    } else if (p.name.rfind("layers.1.attn.", 0) == 0) {
      CHECK(dmax > 0);
      CHECK(err <= 1e-5 * dmax + 1e-9);
      ++halved;
    } else {
      CHECK(err == 0);  // the first step's gradients are the same in both runs
    }
  }
  CHECK(halved == 4);  // wq, wk, wv, wo
  // Only the weights are held: the moments of a scale-0 parameter still advance.
  CHECK(scaled.optimizer().exp_avg_sq().numel() == full.optimizer().exp_avg_sq().numel());
}

TEST_CASE("lr_scale: the effective config keeps it; refusals name optimizer.lr_scale") {
  const Config c = tiny_run_config("llama", {"optimizer.lr_scale=[{ pattern = \"embed.*\", scale = 0.25 }]"});
  REQUIRE(c.optimizer.lr_scale.size() == 1);
  CHECK(parse_config(config_to_toml(c), "effective.toml").optimizer.lr_scale == c.optimizer.lr_scale);
  auto refused = [](const std::vector<std::string>& o, const std::vector<std::string>& words, bool at_start = false) {
    const std::string e = error_of([&] {
      const Config cfg = tiny_run_config("llama", o);
      if (at_start) Trainer t(cfg, false);
    });
    INFO(e);
    CHECK(e.find("optimizer.lr_scale") != std::string::npos);
    for (const auto& w : words) CHECK(e.find(w) != std::string::npos);
  };
  refused({"optimizer.lr_scale=[{ pattern = \"embed.*\", scale = -0.5 }]"}, {">= 0", "embed.*"});
  refused({"optimizer.lr_scale=[{ pattern = \"\", scale = 0.5 }]"}, {"empty"});
  refused({"optimizer.lr_scale=[{ pattern = \"embed.*\" }]"}, {"both pattern and scale"});
  refused({"optimizer.lr_scale=[{ pattern = \"embed.*\", scale = 1, lr = 2 }]"}, {"lr", "unknown key"});
  refused({"optimizer.lr_scale={ \"embed.*\" = 0.5 }"}, {"expected an array"});
  refused({"optimizer.lr_scale=[{ pattern = \"layers.*.attn.nope\", scale = 0.5 }]"}, {"layers.*.attn.nope", "matches no"}, true);
  refused({"lora.rank=2", "optimizer.lr_scale=[{ pattern = \"embed.*\", scale = 0.5 }]"}, {"embed.*", "frozen"}, true);
}
