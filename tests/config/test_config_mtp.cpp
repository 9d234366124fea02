// model.prediction_heads and model.prediction_loss_weights: the weights' default, a TOML array
// and a command-line override of it, the effective config's round trip, and every refusal with
// its "file:line: key: " prefix.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/check.h"

using namespace engine;

namespace {

// Lines: 1 [model]  2.. model_extra  then vocab_size, hidden_size, num_layers, num_heads, [data] ...
std::string doc(const std::string& model_extra = "", const std::string& tail = "") {
  return "[model]\n" + model_extra +
         "vocab_size = 256\n"
         "hidden_size = 64\n"
         "num_heads = 4\n"
         "[data]\n"
         "train = [\"data/a\"]\n"
         "sequence_length = 32\n"
         "[training]\n"
         "steps = 10\n" +
         tail;
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "t.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("config: prediction heads default their loss weights to 1 and round-trip") {
  Config c = parse_config(doc("num_layers = 3\nprediction_heads = 2\n"), "t.toml");
  CHECK(c.model.prediction_heads == 2);
  CHECK(c.model.prediction_loss_weights == std::vector<double>{1.0, 1.0, 1.0});
  Config d = parse_config(doc("num_layers = 3\nprediction_heads = 1\nprediction_loss_weights = [1, 0.25]\n"), "t.toml");
  CHECK(d.model.prediction_loss_weights == std::vector<double>{1.0, 0.25});
  Config e = parse_config(doc("num_layers = 3\n"), "t.toml",
                          {"model.prediction_heads=2", "model.prediction_loss_weights=[0.5, 0.3, 0.2]"});
  CHECK(e.model.prediction_loss_weights == std::vector<double>{0.5, 0.3, 0.2});
  const std::string toml = config_to_toml(e);
  CHECK(toml.find("prediction_loss_weights = [0.5, 0.3, 0.2]") != std::string::npos);
  CHECK(parse_config(toml, "effective.toml").model == e.model);
  Config off = parse_config(doc("num_layers = 2\n"), "t.toml");
  CHECK(off.model.prediction_heads == 0);
  CHECK(off.model.prediction_loss_weights.empty());
  CHECK(parse_config(config_to_toml(off), "effective.toml").model == off.model);
}

TEST_CASE("config: prediction heads refuse what they cannot represent, naming the key") {
  struct Case {
    const char* name;
    std::string text;
    std::vector<std::string> overrides;
    std::string prefix, detail;
  };
  const std::vector<Case> cases = {
      {"negative heads", doc("num_layers = 3\nprediction_heads = -1\n"), {}, "t.toml:3: model.prediction_heads: ",
       "must be >= 0, got -1"},
      {"one layer", doc("num_layers = 1\nprediction_heads = 1\n"), {}, "t.toml:3: model.prediction_heads: ",
       "needs model.num_layers >= 2"},
      {"wrong length", doc("num_layers = 3\nprediction_heads = 2\nprediction_loss_weights = [1.0, 0.5]\n"), {},
       "t.toml:4: model.prediction_loss_weights: ", "needs prediction_heads + 1 = 3 weights"},
      {"negative weight", doc("num_layers = 3\nprediction_heads = 1\nprediction_loss_weights = [1.0, -0.5]\n"), {},
       "t.toml:4: model.prediction_loss_weights: ", "weight 1 must be >= 0, got -0.5"},
      {"all zero", doc("num_layers = 3\nprediction_heads = 1\nprediction_loss_weights = [0, 0]\n"), {},
       "t.toml:4: model.prediction_loss_weights: ", "all 0"},
      {"weights without heads", doc("num_layers = 3\nprediction_loss_weights = [1.0]\n"), {},
       "t.toml:3: model.prediction_loss_weights: ", "set model.prediction_heads > 0"},
      {"not an array", doc("num_layers = 3\nprediction_heads = 1\nprediction_loss_weights = 1.0\n"), {},
       "t.toml:4: model.prediction_loss_weights: ", "expected an array of numbers"},
      {"not numbers", doc("num_layers = 3\nprediction_heads = 1\nprediction_loss_weights = [1.0, \"a\"]\n"), {},
       "t.toml:4: model.prediction_loss_weights: [1]: ", "expected a number"},
      {"override of the wrong length", doc("num_layers = 3\nprediction_heads = 1\n"),
       {"model.prediction_loss_weights=[1, 1, 1]"}, "<command line>: model.prediction_loss_weights: ",
       "needs prediction_heads + 1 = 2 weights"},
  };
  for (const Case& k : cases) {
    SUBCASE(k.name) {
      const std::string msg = error_of(k.text, k.overrides);
      INFO(msg);
      CHECK(msg.rfind(k.prefix, 0) == 0);
      CHECK(msg.find(k.detail) != std::string::npos);
    }
  }
}

TEST_CASE("config: prediction heads are not combined with distillation") {
  namespace fs = std::filesystem;
  const fs::path teacher = fs::temp_directory_path() / "engine_mtp_teacher_config";
  fs::create_directories(teacher);
  std::ofstream(teacher / "config.json") << "{}\n";
  const std::string msg =
      error_of(doc("num_layers = 3\nprediction_heads = 1\n", "[distillation]\nteacher = \"" + teacher.string() + "\"\n"));
  INFO(msg);
  CHECK(msg.rfind("t.toml:3: model.prediction_heads: ", 0) == 0);
  CHECK(msg.find("not combined with distillation") != std::string::npos);
  fs::remove_all(teacher);
}

TEST_CASE("config: prediction heads are not combined with LoRA") {
  const std::string msg = error_of(doc("num_layers = 3\nprediction_heads = 1\n", "[lora]\nrank = 4\n"));
  INFO(msg);
  CHECK(msg.rfind("t.toml:3: model.prediction_heads: ", 0) == 0);
  CHECK(msg.find("not combined with LoRA") != std::string::npos);
}
