// The trainer's checks before the first step: token ids against the vocabulary over the whole
// dataset, the epochs a run makes over a dataset too short for it, non-finite weights in a
// checkpoint it resumes, a teacher it loads or a Hugging Face folder it starts from, and a fresh
// run that would overwrite an earlier run's files.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/hf.h"
#include "core/log.h"
#include "data/dataset_writer.h"
#include "models/model.h"
#include "tests/common/testing.h"
#include "tests/common/tiny.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {


std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}


}  // namespace

TEST_CASE("checks: a token id past the vocabulary anywhere in the data stops the run before its first step") {
  // The learnable data holds ids up to 36: with a vocabulary of 30 its first id >= 30 is named.
  std::string e = error_of([] { Trainer t(tiny_run_config("llama", {"model.vocab_size=30"}), false); });
  INFO(e);
  CHECK(e.find("data.train[0]: " + learnable_dataset() + ".bin: document ") != std::string::npos);
  CHECK(e.find(">= model.vocab_size (30)") != std::string::npos);
}

TEST_CASE("checks: a dataset far shorter than the run needs is refused past data.max_epochs, allowed with 0") {
  QuietLogs quiet;
  const fs::path dir = fs::path(learnable_dataset()).parent_path() / "short";
  fs::create_directories(dir);
  const std::string data = (dir / "tiny").string();
  write_token_dataset(data, {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {11, 12, 13, 14, 15}}, 37);
  const std::vector<std::string> o = {"data.train=[\"" + data + "\"]", "data.valid_fraction=0"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), o.begin(), o.end());
    return tiny_run_config("llama", extra);
  };
  // 100 steps x 8 sequences x 20 tokens from 15 tokens: (16000 + 1) / 15 = 1066.7 epochs.
  const std::string e = error_of([&] { Trainer t(with({"training.steps=100"}), false); });
  INFO(e);
  CHECK(e.find("data.train[0]: " + data + ": the run takes 800 samples of 21 tokens from its 15 tokens (3 documents): "
               "1066.7 epochs, more than data.max_epochs = 1000") != std::string::npos);
  Trainer allowed(with({"training.steps=100", "data.max_epochs=0"}), false);
  CHECK(std::isfinite(allowed.train_step().loss));
  Trainer fewer(with({"training.steps=40"}), false);  // 427 epochs: a warning
  CHECK(std::isfinite(fewer.train_step().loss));
}

TEST_CASE("checks: a NaN in a resumed checkpoint or a teacher checkpoint is an error naming the tensor") {
  QuietLogs quiet;
  Config c = tiny_run_config("llama", {"run.name=nan-ckpt", "training.steps=4"});
  Trainer t(c, false);
  t.train_step();
  const ParamSpec& w = t.model().params().table().get("layers.1.mlp.w_up");
  SUBCASE("exp_avg") {
    static_cast<float*>(t.optimizer().exp_avg().data)[w.offset + 5] = NAN;
    const std::string dir = t.save_checkpoint();
    const std::string e = error_of([&] {
      Trainer r(tiny_run_config("llama", {"run.name=nan-ckpt", "training.resume=\"" + dir + "\""}), false);
    });
    INFO(e);
    CHECK(e.find("checkpoint " + dir + ": exp_avg: layers.1.mlp.w_up: element 5 is nan") != std::string::npos);
  }
  SUBCASE("master weights, resumed and as a distillation teacher") {
    t.model().params().weight("layers.1.mlp.w_up").ptr<float>()[7] = INFINITY;  // the master on the CPU
    const std::string dir = t.save_checkpoint();
    std::string e = error_of([&] {
      Trainer r(tiny_run_config("llama", {"run.name=nan-ckpt", "training.resume=\"" + dir + "\""}), false);
    });
    INFO(e);
    CHECK(e.find("checkpoint " + dir + ": master: layers.1.mlp.w_up: element 7 is inf") != std::string::npos);
    e = error_of([&] {
      Trainer s(tiny_run_config("llama", {"run.name=nan-student", "distillation.teacher=\"" + dir + "\""}), false);
    });
    CHECK(e.find("distillation.teacher " + dir + ": layers.1.mlp.w_up: element 7 is inf") != std::string::npos);
  }
}

TEST_CASE("checks: a fresh run never overwrites an earlier run's files unless run.overwrite or training.resume says so") {
  QuietLogs quiet;
  const std::vector<std::string> o = {"run.name=again", "training.steps=2", "training.checkpoint_every=2",
                                      "optimizer.warmup_steps=1"};
  auto config = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), o.begin(), o.end());
    return tiny_run_config("llama", extra);
  };
  const Config c = config({});
  const fs::path run_dir = fs::path(c.run.output_dir) / "again";
  fs::remove_all(run_dir);
  {
    Trainer t(c);
    REQUIRE(t.run() == 0);
  }
  const std::string metrics = read_file((run_dir / "metrics.jsonl").string());
  REQUIRE(!metrics.empty());
  REQUIRE(fs::exists(run_dir / "checkpoints" / "step_2" / "metadata.json"));

  const std::string e = error_of([&] { Trainer t(c); });
  INFO(e);
  CHECK(e.find("run.name: the run directory " + run_dir.string() +
               " already holds an earlier run's metrics.jsonl, checkpoints/") != std::string::npos);
  CHECK(e.find("training.resume = \"auto\"") != std::string::npos);
  CHECK(e.find("run.overwrite = true") != std::string::npos);
  CHECK(read_file((run_dir / "metrics.jsonl").string()) == metrics);  // nothing touched
  CHECK(fs::exists(run_dir / "checkpoints" / "step_2" / "metadata.json"));
  {  // an in-memory trainer writes no run directory: no check
    Trainer t(c, false);
  }
  {  // resume = auto continues the run (nothing left to train)
    Trainer t(config({"training.resume=\"auto\""}));
    CHECK(t.step() == 2);
  }
  {  // overwrite: the earlier run's files go, the new run writes its own
    Trainer t(config({"run.overwrite=true", "training.steps=1", "training.checkpoint_every=0"}));
    CHECK(!fs::exists(run_dir / "checkpoints"));
    REQUIRE(t.run() == 0);
    const std::string now = read_file((run_dir / "metrics.jsonl").string());
    CHECK(std::count(now.begin(), now.end(), '\n') == 1);
  }
}

TEST_CASE("checks: a NaN or infinity in model.init_from's weights is an error naming the file, tensor and element") {
  struct Case {
    const char* family;
    std::string param;
    int64_t element;
    float value;
    std::string tensor;
  };
  const Config mixtral = tiny_run_config("mixtral");
  const int64_t expert = int64_t{mixtral.model.ffn_hidden_size} * mixtral.model.hidden_size;
  for (const Case& k : {Case{"llama", "layers.1.mlp.w_up", 5, NAN, "model.layers.1.mlp.up_proj.weight"},
                        Case{"mixtral", "layers.0.moe.w_up", expert + 3, INFINITY,
                             "model.layers.0.block_sparse_moe.experts.1.w3.weight"}}) {
    CAPTURE(k.family);
    const Config src = tiny_run_config(k.family);
    auto m = make_model(src.model, Device::CPU, DType::F32);
    randomize_weights(m->params(), "init-nan", 0.2);
    m->params().weight(k.param).ptr<float>()[k.element] = k.value;
    const std::string dir = (fs::path(learnable_dataset()).parent_path() / (std::string("hf-nan-") + k.family)).string();
    const ParamStore& store = m->params();
    hf::export_hf(src.model, store.table(),
                  [&store](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
                    std::memcpy(out, store.weight(p.name).ptr<float>() + lo, static_cast<size_t>(hi - lo) * 4);
                  },
                  dir);
    const std::string e = error_of([&] {
      Trainer t(tiny_run_config(k.family, {"model.init_from=\"" + dir + "\""}), false);
    });
    INFO(e);
    CHECK(e.find(dir + "/model.safetensors: tensor '" + k.tensor + "': " + k.param + ": element " +
                 std::to_string(k.element) + " is " + (std::isnan(k.value) ? "nan" : "inf")) != std::string::npos);
  }
}
