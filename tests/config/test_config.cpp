// The run config: parsing, family presets and defaults, round trip through config_to_toml,
// command-line overrides, and every class of error with its "file:line: key.path: " prefix.
// Errors are a table of cases (text, overrides, expected prefix and detail), one SUBCASE each.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/check.h"
#include "tests/common/testing.h"

using namespace engine;

namespace {

// A minimal valid config. Without model_extra its lines are:
//   1 [model]  2 vocab_size  3 hidden_size  4 num_layers  5 num_heads  6 [data]  7 train
//   8 sequence_length  9 [training]  10 steps  11.. tail (still inside [training])
// model_extra lines go in at line 2 and shift the rest down.
std::string doc(const std::string& model_extra = "", const std::string& tail = "") {
  return "[model]\n" + model_extra +
         "vocab_size = 256\n"
         "hidden_size = 64\n"
         "num_layers = 2\n"
         "num_heads = 4\n"
         "[data]\n"
         "train = [\"data/a\"]\n"
         "sequence_length = 32\n"
         "[training]\n"
         "steps = 10\n" +
         tail;
}

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, "t.toml", overrides);
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Every key set, none to its default.
const char* kFull = R"(# a full config
[run]
name = "full \"run\""
output_dir = "out/runs"
seed = 42
device = "cpu"
log_every = 5
debug_level = 2

[model]
family = "mistral"
vocab_size = 1000
hidden_size = 96
num_layers = 3
num_heads = 6
num_kv_heads = 2
head_dim = 32
ffn_hidden_size = 300
norm = "layernorm"
norm_eps = 1e-6
activation = "gelu"
positions = "learned"
max_position_embeddings = 256
rope_theta = 500000.0
sliding_window = 64
bias = true
tie_embeddings = true
init_std = 0.01

[data]
train = [
  { path = "/data/web", weight = 0.7 },
  { path = "/data/code", weight = 0.3333333333333333 },
  "/data/books",
]
valid = [{ path = "/data/valid" }]
valid_fraction = 0.05
sequence_length = 128
truncate_documents = false
cross_document_attention = true

[batch]
micro_batch_size = 4
global_batch_size = 32

[optimizer]
lr = 6e-4
min_lr = 6e-5
warmup_steps = 100
decay = "linear"
decay_steps = 800
weight_decay = 0.05
beta1 = 0.8
beta2 = 0.99
eps = 1e-10
grad_clip = 0.5

[training]
steps = 1000
eval_every = 50
eval_steps = 3
)";

}  // namespace

TEST_CASE("config: a full config parses and round-trips through config_to_toml") {
  Config c = parse(kFull);
  CHECK(c.run.name == "full \"run\"");
  CHECK(c.run.seed == 42);
  CHECK(c.run.device == DeviceChoice::CPU);
  CHECK(c.model.family == ModelFamily::Mistral);
  CHECK(c.model.norm == NormKind::LayerNorm);  // set keys win over the family preset
  CHECK(c.model.sliding_window == 64);
  CHECK(c.model.norm_eps == 1e-6);
  REQUIRE(c.data.train.size() == 3);
  CHECK(c.data.train[0].path == "/data/web");
  CHECK(c.data.train[0].weight == 0.7);
  CHECK(c.data.train[0].line == 32);
  CHECK(c.data.train[2].path == "/data/books");
  CHECK(c.data.train[2].weight == 1.0);
  CHECK(c.data.train[2].line == 34);
  REQUIRE(c.data.valid.size() == 1);
  CHECK(c.data.valid[0].weight == 1.0);
  CHECK(c.batch.accumulation_steps == 8);
  CHECK(c.optimizer.decay == DecayKind::Linear);
  CHECK(c.optimizer.decay_steps == 800);
  CHECK(c.optimizer.eps == 1e-10);
  CHECK(c.training.eval_steps == 3);

  const std::string text = config_to_toml(c);
  INFO(text);
  CHECK(text.find("# accumulation_steps = 8") != std::string::npos);
  Config back = parse(text);
  CHECK(back == c);
  CHECK(config_to_toml(back) == text);

  // A minimal config round-trips too, with every default and preset written out.
  Config m = parse(doc());
  const std::string mt = config_to_toml(m);
  INFO(mt);
  Config mback = parse(mt);
  CHECK(mback == m);
  CHECK(mt.find("ffn_hidden_size = 256") != std::string::npos);
  CHECK(mt.find("decay_steps = 10") != std::string::npos);
  // Written values count as set when read back: presets no longer apply to them.
  CHECK(mback.is_set("model.norm"));
  CHECK_FALSE(m.is_set("model.norm"));
}

TEST_CASE("config: config_to_toml writes floats that read back exactly") {
  const double values[] = {0.1 + 0.2, 3e-4, 1e-8, 5e-324, 1e300, 1.7976931348623157e308, 12345.0,
                           2.0 / 3.0};
  Config c = parse(doc());
  for (double v : values) {
    CAPTURE(v);
    c.optimizer.eps = v;
    c.data.train[0].weight = v;
    CHECK(parse(config_to_toml(c)) == c);
  }
}

TEST_CASE("config: family presets and defaults fill the unset keys") {
  struct Case {
    const char* family;
    NormKind norm;
    ActivationKind act;
    PositionKind pos;
    bool bias, tie;
    int sliding_window;
    int ffn;  // hidden 4096: gelu 4 * 4096; swiglu 256 * ceil(10922 / 256) = 11008 (Llama 7B)
  };
  const Case cases[] = {
      {"gpt2", NormKind::LayerNorm, ActivationKind::GELU, PositionKind::Learned, true, true, 0,
       16384},
      {"llama", NormKind::RMSNorm, ActivationKind::SwiGLU, PositionKind::Rope, false, false, 0,
       11008},
      {"mistral", NormKind::RMSNorm, ActivationKind::SwiGLU, PositionKind::Rope, false, false,
       4096, 11008},
  };
  for (const Case& k : cases) {
    SUBCASE(k.family) {
      Config c = parse(doc(std::string("family = \"") + k.family + "\"\n"),
                       {"model.hidden_size=4096", "model.num_heads=32"});
      CHECK(std::string(family_name(c.model.family)) == k.family);
      CHECK(c.model.norm == k.norm);
      CHECK(c.model.activation == k.act);
      CHECK(c.model.positions == k.pos);
      CHECK(c.model.bias == k.bias);
      CHECK(c.model.tie_embeddings == k.tie);
      CHECK(c.model.sliding_window == k.sliding_window);
      CHECK(c.model.norm_eps == 1e-5);
      CHECK(c.model.ffn_hidden_size == k.ffn);
      CHECK(c.model.num_kv_heads == 32);
      CHECK(c.model.head_dim == 128);
      CHECK(c.model.max_position_embeddings == 32);
      CHECK(c.batch.accumulation_steps == 1);
      CHECK(c.optimizer.decay_steps == 10);
    }
  }
  SUBCASE("qwen3: llama + qk_norm, norm_eps 1e-6, rope_theta 1e6, no biases; qk_norm off elsewhere") {
    Config q = parse(doc("family = \"qwen3\"\nhead_dim = 32\n"));
    CHECK(q.model.qk_norm);
    CHECK(q.model.norm_eps == 1e-6);
    CHECK(q.model.rope_theta == 1e6);
    CHECK_FALSE(q.model.bias);
    CHECK_FALSE(q.model.qkv_bias);
    CHECK_FALSE(q.model.tie_embeddings);
    CHECK(q.model.head_dim == 32);  // head_dim x num_heads (128) != hidden_size (64)
    CHECK(parse(config_to_toml(q)) == q);
    CHECK_FALSE(parse(doc("family = \"qwen3\"\nqk_norm = false\n")).model.qk_norm);
    CHECK(parse(doc("qk_norm = true\n")).model.qk_norm);  // llama with q/k norms (OLMo-2 style)
    CHECK_FALSE(parse(doc("family = \"qwen2\"\n")).model.qk_norm);
    CHECK(error_of(doc("family = \"mamba\"\nqk_norm = true\n")).find("t.toml:3: model.qk_norm: set, but the model "
                                                                    "has no attention blocks") != std::string::npos);
  }
  SUBCASE("set keys win over presets") {
    Config c = parse(doc("family = \"mistral\"\nsliding_window = 0\nbias = true\n"));
    CHECK(c.model.sliding_window == 0);
    CHECK(c.model.bias);
    CHECK_FALSE(c.model.tie_embeddings);
  }
  SUBCASE("derived and dependent defaults") {
    Config c = parse(doc("", "[batch]\nmicro_batch_size = 2\nglobal_batch_size = 8\n"
                             "[optimizer]\nwarmup_steps = 3\n"));
    CHECK(c.batch.accumulation_steps == 4);
    CHECK(c.optimizer.decay_steps == 7);
    Config s = parse(doc("activation = \"swiglu\"\n"),
                     {"model.hidden_size=768", "model.num_heads=12"});
    CHECK(s.model.ffn_hidden_size == 2048);  // 8 * 768 / 3 = 2048 exactly
    Config h = parse(doc("head_dim = 10\n"), {"model.num_heads=5"});  // 64 % 5 != 0 is fine here
    CHECK(h.model.head_dim == 10);
  }
}

TEST_CASE("config: integer and float type rules") {
  Config c = parse(doc("num_kv_heads = 2.0\ninit_std = 1\nrope_theta = 1e4\n"));
  CHECK(c.model.num_kv_heads == 2);  // an integral float is accepted for an int
  CHECK(c.model.init_std == 1.0);    // an integer is accepted for a float
  CHECK(c.model.rope_theta == 10000.0);
  Config s = parse(doc(), {"training.steps=1e3", "run.seed=9223372036854775807"});
  CHECK(s.training.steps == 1000);
  CHECK(s.run.seed == 9223372036854775807ull);
}

TEST_CASE("config: overrides") {
  SUBCASE("valid overrides, typed or bare") {
    Config c = parse(doc(), {"optimizer.lr=3e-3", "run.name=\"x y\"", "run.output_dir=out/dir",
                             "data.truncate_documents=false", " model.family = gpt2 ",
                             "training.steps=20", "run.device=cuda"});
    CHECK(c.optimizer.lr == 3e-3);
    CHECK(c.run.name == "x y");
    CHECK(c.run.output_dir == "out/dir");
    CHECK_FALSE(c.data.truncate_documents);
    CHECK(c.model.family == ModelFamily::GPT2);
    CHECK(c.model.norm == NormKind::LayerNorm);  // presets apply after overrides
    CHECK(c.training.steps == 20);               // replaces the file's 10
    CHECK(c.optimizer.decay_steps == 20);
    CHECK(c.run.device == DeviceChoice::CUDA);
    CHECK(c.origin.at("training.steps") == "<command line>");
    CHECK(c.origin.at("model.vocab_size") == "t.toml:2");
  }
  SUBCASE("a string key takes the text as written, the last override wins") {
    Config c = parse(doc(), {"run.name=123", "run.output_dir=1", "run.output_dir=true"});
    CHECK(c.run.name == "123");
    CHECK(c.run.output_dir == "true");
  }
  SUBCASE("datasets") {
    Config c = parse_config(doc(), "cfg/t.toml",
                            {"data.valid=[{path = \"v\", weight = 2}, \"w\"]", "data.train=x/y"});
    REQUIRE(c.data.train.size() == 1);
    CHECK(c.data.train[0].path == "x/y");  // command-line paths stay relative to the cwd
    CHECK(c.data.train[0].line == 0);
    REQUIRE(c.data.valid.size() == 2);
    CHECK(c.data.valid[0].weight == 2.0);
    CHECK(c.data.valid[1].path == "w");
  }
}

TEST_CASE("config: errors name the file, the line and the key") {
  struct Case {
    const char* name;
    std::string text;
    std::vector<std::string> overrides;
    std::string prefix;  // the message starts with this ("file:line: key.path: ")
    std::string detail;  // and contains this
  };
  const std::string kData6 =  // doc() with [data] replaced: train entries on lines 8-10
      "[model]\nvocab_size = 256\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n"
      "[data]\ntrain = [\n  { path = \"a\", weight = 2 },\n  \"b\",\n"
      "  { path = \"c\", weight = 0 },\n]\nsequence_length = 32\n[training]\nsteps = 10\n";
  const std::vector<Case> cases = {
      // syntax
      {"syntax: unclosed header", "[model\nvocab_size = 1\n", {}, "t.toml:1:7: ",
       "TOML syntax error"},
      {"syntax: bad value", doc("hidden = = 3\n"), {}, "t.toml:2:10: ",
       "TOML syntax error"},
      // unknown keys
      {"unknown key with suggestion", doc("hiden_size = 64\n"), {},
       "t.toml:2: model.hiden_size: ", "unknown key (did you mean model.hidden_size?)"},
      {"unknown section", doc("", "[optimiser]\nlr = 1.0\n"), {}, "t.toml:11: optimiser: ",
       "unknown key (did you mean [optimizer]?)"},
      {"key in the wrong section", doc("", "lr = 0.1\n"), {}, "t.toml:11: training.lr: ",
       "unknown key (did you mean optimizer.lr?)"},
      {"subtable", doc("", "[model.moe]\nnum_experts = 8\n"), {}, "t.toml:11: model.moe: ",
       "unknown key"},
      {"derived key", doc("", "[batch]\naccumulation_steps = 2\n"), {},
       "t.toml:12: batch.accumulation_steps: ", "derived"},
      {"dataset key", doc(), {"data.train=[{path = \"a\", wieght = 2}]"},
       "<command line>: data.train[0].wieght: ", "unknown key"},
      // wrong types
      {"string for int", doc("num_kv_heads = \"4\"\n"), {}, "t.toml:2: model.num_kv_heads: ",
       "expected an integer, got string \"4\""},
      {"fractional float for int", doc("num_kv_heads = 2.5\n"), {},
       "t.toml:2: model.num_kv_heads: ", "expected an integer, got float 2.5"},
      {"int for bool", doc("bias = 1\n"), {}, "t.toml:2: model.bias: ", "expected a boolean"},
      {"int for string", doc("", "[run]\nname = 5\n"), {}, "t.toml:12: run.name: ",
       "expected a string, got integer 5"},
      {"string for float", doc(), {"optimizer.lr=abc"}, "<command line>: optimizer.lr: ",
       "expected a number, got string \"abc\""},
      {"bad enum", doc("norm = \"RMSNorm\"\n"), {}, "t.toml:2: model.norm: ",
       "unknown value \"RMSNorm\", expected \"layernorm\" or \"rmsnorm\""},
      {"bad family", doc("family = \"mixtrall\"\n"), {}, "t.toml:2: model.family: ",
       "expected \"gpt2\", \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"mixtral\", \"qwen2_moe\", \"qwen3_moe\", \"mamba\", \"mamba2\" or \"hybrid\""},
      {"section not a table", "run = 5\n" + doc(), {}, "t.toml:1: run: ", "expected a table"},
      {"nan", doc("init_std = nan\n"), {}, "t.toml:2: model.init_std: ", "must be finite"},
      // out of range
      {"int overflow", doc("num_kv_heads = 3000000000\n"), {}, "t.toml:2: model.num_kv_heads: ",
       "out of range"},
      {"float int overflow", doc(), {"training.steps=1e10"}, "<command line>: training.steps: ",
       "out of range"},
      {"negative seed", doc("", "[run]\nseed = -1\n"), {}, "t.toml:12: run.seed: ", "out of range"},
      {"zero kv heads", doc("num_kv_heads = 0\n"), {}, "t.toml:2: model.num_kv_heads: ",
       "must be > 0, got 0"},
      {"negative size", doc(), {"model.hidden_size=-64"}, "<command line>: model.hidden_size: ",
       "must be > 0, got -64"},
      {"zero micro batch", doc("", "[batch]\nmicro_batch_size = 0\n"), {},
       "t.toml:12: batch.micro_batch_size: ", "must be > 0"},
      {"negative lr", doc("", "[optimizer]\nlr = -1.0\n"), {}, "t.toml:12: optimizer.lr: ",
       "must be >= 0"},
      {"beta1 = 1", doc("", "[optimizer]\nbeta1 = 1.0\n"), {}, "t.toml:12: optimizer.beta1: ",
       "must be in [0, 1)"},
      {"negative beta2", doc("", "[optimizer]\nbeta2 = -0.1\n"), {},
       "t.toml:12: optimizer.beta2: ", "must be in [0, 1)"},
      {"zero eps", doc("", "[optimizer]\neps = 0\n"), {}, "t.toml:12: optimizer.eps: ",
       "must be > 0"},
      {"negative grad_clip", doc("", "[optimizer]\ngrad_clip = -1\n"), {},
       "t.toml:12: optimizer.grad_clip: ", "must be >= 0"},
      {"valid_fraction = 1", doc(), {"data.valid_fraction=1"},
       "<command line>: data.valid_fraction: ", "must be in [0, 1)"},
      {"zero dataset weight", kData6, {}, "t.toml:10: data.train[2].weight: ", "must be > 0"},
      {"zero steps", doc(), {"training.steps=0"}, "<command line>: training.steps: ",
       "must be > 0"},
      // missing required values
      {"missing vocab_size", "[model]\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n", {},
       "t.toml:1: model.vocab_size: ", "required, not set"},
      {"missing section", "[model]\nvocab_size = 9\nhidden_size = 64\nnum_layers = 2\n"
                          "num_heads = 4\n[data]\ntrain = [\"a\"]\nsequence_length = 8\n",
       {}, "t.toml: training.steps: ", "required, not set"},
      {"empty train", doc(), {"data.train=[]"}, "<command line>: data.train: ",
       "at least one dataset"},
      {"missing sequence_length", doc(), {"data.sequence_length=0"},
       "<command line>: data.sequence_length: ", "must be > 0"},
      // inconsistent values
      {"kv heads", doc("num_kv_heads = 3\n"), {}, "t.toml:2: model.num_kv_heads: ",
       "must divide num_heads (4), got 3"},
      {"heads vs hidden", doc(), {"model.num_heads=5"}, "<command line>: model.num_heads: ",
       "must divide hidden_size (64) unless model.head_dim is set"},
      {"odd rope head_dim", doc("head_dim = 15\n"), {}, "t.toml:2: model.head_dim: ",
       "must be even with rope positions"},
      {"odd default head_dim", doc("", ""), {"model.hidden_size=60"}, "t.toml:1: model.head_dim: ",
       "must be even with rope positions, got 15 (hidden_size / num_heads)"},
      {"batch multiple", doc("", "[batch]\nmicro_batch_size = 3\nglobal_batch_size = 8\n"), {},
       "t.toml:13: batch.global_batch_size: ", "must be a multiple of micro_batch_size (3)"},
      {"learned positions", doc("family = \"gpt2\"\nmax_position_embeddings = 16\n"), {},
       "t.toml:3: model.max_position_embeddings: ", "must be >= data.sequence_length (32)"},
      {"warmup > steps", doc("", "[optimizer]\nwarmup_steps = 11\n"), {},
       "t.toml:12: optimizer.warmup_steps: ", "must be <= training.steps (10)"},
      {"eval without valid data", doc("", "eval_every = 5\n"), {},
       "t.toml:11: training.eval_every: ", "validation needs data"},
      {"min_lr > lr", doc("", "[optimizer]\nlr = 1e-4\nmin_lr = 1e-3\n"), {},
       "t.toml:13: optimizer.min_lr: ", "must be <= lr"},
      {"log_every = 0", doc("", "[run]\nlog_every = 0\n"), {}, "t.toml:12: run.log_every: ",
       "must be >= 1"},
      // malformed overrides
      {"override without =", doc(), {"optimizer.lr"}, "<command line>: ",
       "malformed override 'optimizer.lr'"},
      {"override with empty key", doc(), {" =3"}, "<command line>: ", "empty key"},
      {"override with empty part", doc(), {"optimizer.=3"}, "<command line>: ",
       "malformed override 'optimizer.=3'"},
      {"override unknown key", doc(), {"optimizer.lrr=3"}, "<command line>: optimizer.lrr: ",
       "unknown key in override 'optimizer.lrr=3' (did you mean optimizer.lr?)"},
      {"override without section", doc(), {"lr=3"}, "<command line>: lr: ",
       "unknown key in override 'lr=3' (did you mean optimizer.lr?)"},
      {"override unknown section", doc(), {"modle.x=3"}, "<command line>: modle.x: ",
       "(did you mean [model]?)"},
      {"override derived key", doc(), {"batch.accumulation_steps=2"},
       "<command line>: batch.accumulation_steps: ", "derived"},
  };
  for (const Case& k : cases) {
    SUBCASE(k.name) {
      CHECK_THROWS_WITH_AS(parse(k.text, k.overrides), doctest::Contains(k.prefix.c_str()), Error);
      const std::string msg = error_of(k.text, k.overrides);
      INFO(msg);
      CHECK(msg.rfind(k.prefix, 0) == 0);  // starts with "file:line: key: "
      CHECK(msg.find(k.detail) != std::string::npos);
    }
  }
}

TEST_CASE("config: no suggestion for a far-off key, eval with valid data is fine") {
  const std::string msg = error_of(doc("", "completely_different = 1\n"));
  CHECK(msg.find("unknown key") != std::string::npos);
  CHECK(msg.find("did you mean") == std::string::npos);
  CHECK(parse(doc("", "eval_every = 5\n"), {"data.valid_fraction=0.1"}).training.eval_every == 5);
  CHECK(parse(doc("", "eval_every = 5\n"), {"data.valid=[\"v\"]"}).data.valid.size() == 1);
}

TEST_CASE("config: where() and dataset paths relative to the config file") {
  Config c = parse(doc());
  CHECK(c.where("model.hidden_size") == "t.toml:3: model.hidden_size: ");
  CHECK(c.where("model.rope_theta") == "t.toml:1: model.rope_theta: ");  // unset: section line
  CHECK(c.where("optimizer.lr") == "t.toml: optimizer.lr: ");            // no such section
  CHECK(c.data.train[0].path == "data/a");  // no directory in the source name: as given

  namespace fs = std::filesystem;
  Config d = parse_config(doc(), "configs/t.toml");
  CHECK(d.data.train[0].path == (fs::absolute("configs") / "data/a").lexically_normal().string());
  CHECK(fs::path(d.data.train[0].path).is_absolute());
}

TEST_CASE("config: load_config reads a file, resolves paths and names a missing file") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("engine_cfg_test_" + std::to_string(engine::testing::test_seed()));
  fs::create_directories(dir);
  const fs::path file = dir / "run.toml";
  {
    std::ofstream out(file);
    out << doc("", "[optimizer]\nlr = 1e-3\n");
  }
  Config c = load_config(file.string(), {"optimizer.lr=2e-3"});
  CHECK(c.source == file.string());
  CHECK(c.optimizer.lr == 2e-3);
  CHECK(c.data.train[0].path == (dir / "data/a").string());
  CHECK(c.where("model.num_heads") == file.string() + ":5: model.num_heads: ");
  // The effective config reloads from anywhere: paths were made absolute.
  Config back = parse_config(config_to_toml(c), "elsewhere/effective.toml");
  CHECK(back == c);

  const std::string missing = (dir / "missing.toml").string();
  const std::string not_found = missing + ": config file not found";
  CHECK_THROWS_WITH_AS(load_config(missing), doctest::Contains(not_found.c_str()), Error);
  CHECK_THROWS_WITH_AS(load_config(dir.string()), doctest::Contains("is a directory"), Error);
  fs::remove_all(dir);
}

TEST_CASE("config: every file in configs/ loads and its effective config round-trips") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("configs")) {
    if (e.path().extension() != ".toml") continue;
    CAPTURE(e.path().string());
    Config c = load_config(e.path().string());
    CHECK(parse_config(config_to_toml(c), "again.toml") == c);
    ++n;
  }
  CHECK(n >= 10);
}

TEST_CASE("config: model.attention_backend parses, round-trips and names itself in its errors") {
  CHECK(parse(doc()).model.attention_backend == AttentionBackendKind::Flash);
  CHECK(parse(doc("attention_backend = \"flash\"\n")).model.attention_backend == AttentionBackendKind::Flash);
  std::string msg = error_of(doc("attention_backend = \"cudnn2\"\n"));
  CHECK(msg.rfind("t.toml:2: model.attention_backend: ", 0) == 0);
  CHECK(msg.find("unknown value \"cudnn2\", expected \"flash\" or \"cudnn\"") != std::string::npos);
  msg = error_of(doc("attention_backend = 1\n"));
  CHECK(msg.rfind("t.toml:2: model.attention_backend: ", 0) == 0);
#ifdef ENGINE_CUDNN
  const Config c = parse(doc("attention_backend = \"cudnn\"\n"));
  CHECK(c.model.attention_backend == AttentionBackendKind::Cudnn);
  CHECK(config_to_toml(c).find("attention_backend = \"cudnn\"") != std::string::npos);
  CHECK(parse_config(config_to_toml(c), "again.toml") == c);
  CHECK(parse(doc(), {"model.attention_backend=cudnn"}).model.attention_backend == AttentionBackendKind::Cudnn);
  // Head dims cuDNN's fused attention does not take (multiples of 8 up to 256).
  msg = error_of(doc("attention_backend = \"cudnn\"\nhead_dim = 20\n"));
  INFO(msg);
  CHECK(msg.rfind("t.toml:2: model.attention_backend: ", 0) == 0);
  CHECK(msg.find("head_dim a multiple of 8") != std::string::npos);
  // Without attention layers the key does not matter.
  CHECK_NOTHROW(parse(doc("family = \"mamba\"\nattention_backend = \"cudnn\"\n")));
#else
  msg = error_of(doc("attention_backend = \"cudnn\"\n"));
  INFO(msg);
  CHECK(msg.rfind("t.toml:2: model.attention_backend: ", 0) == 0);
  CHECK(msg.find("built without cuDNN") != std::string::npos);
  msg = error_of(doc(), {"model.attention_backend=cudnn"});
  CHECK(msg.rfind("<command line>: model.attention_backend: ", 0) == 0);
#endif
}

TEST_CASE("config: distributed.cross_entropy_splits = 0 picks the fewest chunks of at most 1 GiB of bf16 logits") {
  // 32 tokens x 256 columns: one chunk.
  CHECK(resolved_cross_entropy_splits(parse(doc())) == 1);
  // 2 x 8192 tokens x 128256 columns x 2 bytes = 3.92 GiB: 4 chunks; over tp 2, 2 chunks.
  const std::vector<std::string> big = {"model.vocab_size=128256", "data.sequence_length=8192",
                                        "batch.micro_batch_size=2", "batch.global_batch_size=2"};
  CHECK(resolved_cross_entropy_splits(parse(doc(), big)) == 4);
  std::vector<std::string> tp2 = big;
  tp2.push_back("distributed.tensor_parallel=2");
  CHECK(resolved_cross_entropy_splits(parse(doc(), tp2)) == 2);
  // micro-sequences: the chunk is cut from the micro-sequence's tokens.
  std::vector<std::string> msl = big;
  msl.push_back("batch.micro_sequence_length=2048");
  CHECK(resolved_cross_entropy_splits(parse(doc(), msl)) == 1);
  // a value given is kept, a negative one refused.
  std::vector<std::string> three = big;
  three.push_back("distributed.cross_entropy_splits=3");
  CHECK(resolved_cross_entropy_splits(parse(doc(), three)) == 3);
  CHECK_THROWS_WITH_AS(parse(doc(), {"distributed.cross_entropy_splits=-1"}),
                       doctest::Contains("distributed.cross_entropy_splits"), Error);
}
