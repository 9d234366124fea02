// The tokenizer against Hugging Face tokenizers: tests/tokenizer/data/ holds small tokenizer.json
// files trained with the Python package and the ids it gives for a few hundred strings
// (tests/tokenizer/make_expected.py wrote them), so these run without Python.
#include <doctest/doctest.h>

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace fs = std::filesystem;
using engine::Tokenizer;
using json = nlohmann::json;

namespace {

const std::string kData = "tests/tokenizer/data/";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot read ", path, " (run the tests from the repository root)");
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

const json& expected() {
  static const json j = json::parse(slurp(kData + "expected.json"));
  return j;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// A scratch folder removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("engine-tok-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return (path / name).string();
  }
};

std::string error_of(const std::string& path) {
  try {
    (void)Tokenizer::load(path);
  } catch (const engine::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("tokenizer: encode and decode agree with Hugging Face tokenizers on every fixture string") {
  std::map<std::string, Tokenizer> toks;
  for (const char* name : {"gpt2.json", "gpt2_strip.json", "gpt2_prefix.json", "split_variants.json", "llama3.json", "qwen2.json", "nemo.json",
                           "spm.json", "spm_meta.json"})
    toks.emplace(name, Tokenizer::load(kData + name));
  INFO("expectations from tokenizers ", expected()["tokenizers_version"].get<std::string>());
  int encode_bad = 0, decode_bad = 0, roundtrips = 0;
  for (const json& c : expected()["encode"]) {
    const Tokenizer& t = toks.at(c["tokenizer"].get<std::string>());
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = t.encode(text);
    if (got != want && ++encode_bad <= 5)
      FAIL_CHECK(c["tokenizer"].get<std::string>(), " encode ", json(text).dump(), ": got ", show(got), " want ", show(want));
    const std::string want_text = c.contains("decoded") ? c["decoded"].get<std::string>() : text;
    const std::string back = t.decode(want);
    if (back != want_text && ++decode_bad <= 5)
      FAIL_CHECK(c["tokenizer"].get<std::string>(), " decode ", show(want), ": got ", json(back).dump(), " want ",
                 json(want_text).dump());
    if (c["roundtrip"].get<bool>()) {
      CHECK(t.decode(got) == text);
      ++roundtrips;
    }
  }
  for (const json& c : expected()["decode"]) {
    const Tokenizer& t = toks.at(c["tokenizer"].get<std::string>());
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    const std::string got = t.decode(ids), want = c["text"].get<std::string>();
    if (got != want && ++decode_bad <= 10)
      FAIL_CHECK(c["tokenizer"].get<std::string>(), " decode ", show(ids), ": got ", json(got).dump(), " want ", json(want).dump());
  }
  CHECK(encode_bad == 0);
  CHECK(decode_bad == 0);
  CHECK(expected()["encode"].size() > 1000);
  CHECK(roundtrips > 1000);
}

TEST_CASE("tokenizer: vocab size, BOS / EOS and add_bos from the post-processor and the config files") {
  const Tokenizer gpt2 = Tokenizer::load(kData + "gpt2.json");
  CHECK(!gpt2.bos_id());
  CHECK(!gpt2.eos_id());
  CHECK(!gpt2.add_bos());
  CHECK(gpt2.token_to_id("<|endoftext|>") == 0);
  const Tokenizer llama3 = Tokenizer::load(kData + "llama3.json");
  CHECK(llama3.bos_id() == llama3.token_to_id("<|begin_of_text|>"));
  CHECK(llama3.add_bos());
  const Tokenizer qwen = Tokenizer::load(kData + "qwen2.json");
  CHECK(qwen.vocab_size() == *qwen.token_to_id("special_word") + 1);

  TempDir dir;
  dir.write("tokenizer.json", slurp(kData + "spm.json"));
  Tokenizer plain = Tokenizer::load(dir.path.string());
  CHECK(plain.bos_id() == 1);
  CHECK(plain.add_bos());
  CHECK(!plain.eos_id());
  CHECK(plain.vocab_size() == static_cast<int64_t>(json::parse(slurp(kData + "spm.json"))["model"]["vocab"].size()));
  dir.write("tokenizer_config.json", R"({"add_bos_token": false, "bos_token": {"content": "<s>", "lstrip": false},
                                        "eos_token": "</s>", "model_max_length": 1000000})");
  dir.write("generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 0]})");
  Tokenizer cfg = Tokenizer::load(dir.path.string());
  CHECK(cfg.bos_id() == 1);
  CHECK(!cfg.add_bos());
  CHECK(cfg.eos_id() == 2);
  CHECK(cfg.eos_ids() == std::vector<int32_t>{2, 0});
  CHECK(cfg.describe().find("tokenizer_config.json") != std::string::npos);
  CHECK(Tokenizer::load((dir.path / "tokenizer.json").string()).eos_id() == 2);  // the file path reads its folder too
  dir.write("tokenizer_config.json", R"({"eos_token": "</nope>"})");
  const std::string e = error_of(dir.path.string());
  CHECK(e.find("tokenizer_config.json") != std::string::npos);
  CHECK(e.find("eos_token") != std::string::npos);
}

TEST_CASE("tokenizer: byte_level is the engine's default data format") {
  const Tokenizer t = Tokenizer::byte_level();
  const std::string s = "h\xC3\xA9llo \xF0\x9F\x98\x80";
  const std::vector<int32_t> ids = t.encode(s);
  CHECK(ids.size() == s.size());
  CHECK(ids[1] == 0xC3);
  CHECK(t.decode(ids) == s);
  CHECK(t.vocab_size() == 257);
  CHECK(t.eos_id() == 256);
  CHECK(!t.bos_id());
  CHECK(!t.add_bos());
  const std::vector<int32_t> with_eos = {'a', 256, 'b', 0xC3, 'c', 999, -1};
  CHECK(t.decode(with_eos) == "ab\xEF\xBF\xBD" "c");
  CHECK(t.describe().find("byte level") != std::string::npos);
}

TEST_CASE("tokenizer: bad tokenizer.json files are refused naming the file and the key") {
  TempDir dir;
  const std::string good = slurp(kData + "gpt2.json");
  json base = json::parse(good);
  struct Case {
    const char* name;
    std::string text;
    std::vector<std::string> needles;
  };
  auto edit = [&](auto f) {
    json j = base;
    f(j);
    return j.dump();
  };
  const std::vector<Case> cases = {
      {"truncated", good.substr(0, good.size() / 2), {"not valid JSON"}},
      {"not an object", "[1, 2]", {"expected a JSON object"}},
      {"wordpiece", edit([](json& j) { j["model"]["type"] = "WordPiece"; }), {"model.type", "WordPiece"}},
      {"unigram", edit([](json& j) { j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}}; }), {"model.type", "Unigram"}},
      {"vocab type", edit([](json& j) { j["model"]["vocab"]["a"] = "x"; }), {"model.vocab[\"a\"]"}},
      {"merge unknown", edit([](json& j) { j["model"]["merges"].push_back({"zzq", "q"}); }), {"model.merges[", "zzq"}},
      {"merge shape", edit([](json& j) { j["model"]["merges"][3] = 7; }), {"model.merges[3]"}},
      {"merge string", edit([](json& j) { j["model"]["merges"][0] = "a b c"; }), {"model.merges[0]"}},
      {"dropout", edit([](json& j) { j["model"]["dropout"] = 0.1; }), {"model.dropout"}},
      {"prefix", edit([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }), {"continuing_subword_prefix"}},
      {"normalizer", edit([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }), {"normalizer.type", "Lowercase"}},
      {"nested", edit([](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKD"}}}}}; }),
       {"normalizer.normalizers[1].type", "NFKD"}},
      {"pre_tokenizer", edit([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }), {"pre_tokenizer.type"}},
      {"pattern", edit([](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(?<=a)b"}}}, {"behavior", "Isolated"}};
       }), {"pre_tokenizer.pattern", "not supported"}},
      {"behavior", edit([](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
       }), {"pre_tokenizer.behavior"}},
      {"decoder", edit([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), {"decoder.type", "WordPiece"}},
      {"post", edit([](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }), {"post_processor.type"}},
      {"single_word", edit([](json& j) { j["added_tokens"][0]["single_word"] = true; }), {"added_tokens[0].single_word"}},
      {"added id", edit([](json& j) { j["added_tokens"][0]["id"] = 5; }), {"added_tokens[0]", "model vocab"}},
      {"unknown key", edit([](json& j) { j["model"]["surprise"] = 1; }), {"model.surprise", "unknown key"}},
      {"bool type", edit([](json& j) { j["model"]["byte_fallback"] = "yes"; }), {"model.byte_fallback"}},
  };
  for (const Case& c : cases) {
    const std::string path = dir.write(std::string(c.name) + ".json", c.text);
    const std::string e = error_of(path);
    INFO(c.name, ": ", e);
    CHECK(e.find(path) != std::string::npos);
    for (const std::string& n : c.needles) CHECK(e.find(n) != std::string::npos);
  }
  CHECK(error_of((dir.path / "missing.json").string()).find("no such tokenizer file") != std::string::npos);
  const Tokenizer t = Tokenizer::load(kData + "gpt2.json");
  CHECK_THROWS_WITH_AS(t.encode("bad \xC3 utf8"), doctest::Contains("not valid UTF-8 at byte 4"), engine::Error);
}

// CPU time of this thread (the test machine's cores are shared: wall time says little).
static double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// 256 KB of one repeated character (the longest pre-tokenizer pieces and merge chains) and of
// mixed text, each within a quarter second of CPU time (the bar of 1 MB a second).
TEST_CASE("tokenizer: 256 KB inputs encode within a quarter second (no pathological backtracking or merging)" *
          doctest::test_suite("full")) {
  std::map<std::string, Tokenizer> toks;
  for (const char* name : {"gpt2.json", "llama3.json", "qwen2.json", "spm.json"}) toks.emplace(name, Tokenizer::load(kData + name));
  const size_t n = 1 << 18;
  std::string mixed;
  while (mixed.size() < n) mixed += "The year 2024, 日本語 😀  \n\tcode(x) {} ";
  const std::vector<std::pair<const char*, std::string>> inputs = {
      {"a", std::string(n, 'a')}, {"space", std::string(n, ' ')}, {"newline", std::string(n, '\n')},
      {"digit", std::string(n, '7')}, {"punct", std::string(n, '!')}, {"mixed", mixed}};
  for (const auto& [tname, t] : toks) {
    for (const auto& [iname, text] : inputs) {
      const double t0 = thread_seconds();
      const std::vector<int32_t> ids = t.encode(text);
      const double s = thread_seconds() - t0;
      INFO(tname, " on 256 KB of ", iname, ": ", s, " s of CPU time, ", ids.size(), " tokens");
      CHECK(s < 0.25);
      CHECK(!ids.empty());
      if (std::string(iname) == "mixed") CHECK(t.decode(ids) == text);
    }
  }
}

TEST_CASE("tokenizer: NFC and lossy UTF-8 decoding") {
  using engine::unicode::from_utf8_lossy;
  using engine::unicode::nfc;
  CHECK(nfc("e\xCC\x81") == "\xC3\xA9");                       // e + acute -> é
  CHECK(nfc("\xE2\x84\xAB") == "\xC3\x85");                    // Angstrom sign -> Å (singleton)
  CHECK(nfc("a\xCC\x88\xCC\xA3") == "\xE1\xBA\xA1\xCC\x88");   // reordered: dot below first, composed
  CHECK(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // Hangul L V T -> 각
  CHECK(nfc("plain ascii") == "plain ascii");
  int bad = 0;
  for (const json& c : expected()["nfc"]) {
    const std::string got = nfc(c[0].get<std::string>());
    if (got != c[1].get<std::string>() && ++bad <= 5)
      FAIL_CHECK("nfc ", c[0].dump(), ": got ", json(got).dump(), " want ", c[1].dump());
  }
  CHECK(expected()["nfc"].size() > 2000);
  CHECK(bad == 0);
  CHECK(from_utf8_lossy("a\xF0\x9F\x98") == "a\xEF\xBF\xBD");          // one truncated sequence: one U+FFFD
  CHECK(from_utf8_lossy("\xC3\x28") == "\xEF\xBF\xBD(");
  CHECK(from_utf8_lossy("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: each byte
  CHECK(from_utf8_lossy("\xFF\xFE") == "\xEF\xBF\xBD\xEF\xBF\xBD");
}

// Published tokenizer.json files (too big to check in): scripts/check_tokenizer.py PATH... writes
// tokenizers' ids for them to a file named by TOKENIZER_EXPECTED and runs this case.
TEST_CASE("tokenizer: published tokenizer.json files agree with tokenizers (scripts/check_tokenizer.py)") {
  const char* file = std::getenv("TOKENIZER_EXPECTED");
  if (!file) {
    MESSAGE("skipped: run scripts/check_tokenizer.py with published tokenizer.json files");
    return;
  }
  const json j = json::parse(slurp(file));
  std::map<std::string, Tokenizer> toks;
  std::map<std::string, int> bad;
  for (const json& c : j["cases"]) {
    const std::string path = c["path"].get<std::string>();
    auto it = toks.find(path);
    if (it == toks.end()) {
      it = toks.emplace(path, Tokenizer::load(path)).first;
      MESSAGE(it->second.describe());
    }
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = it->second.encode(text);
    if (got != want && ++bad[path] <= 3)
      FAIL_CHECK(path, " encode ", json(text).dump().substr(0, 200), ": got ", show(got).substr(0, 300), " want ",
                 show(want).substr(0, 300));
    const std::string back = it->second.decode(want), want_text = c["decoded"].get<std::string>();
    if (back != want_text && ++bad[path] <= 3)
      FAIL_CHECK(path, " decode ", show(want).substr(0, 300), ": got ", json(back).dump().substr(0, 200));
  }
  for (const auto& [path, t] : toks) {
    INFO(path);
    CHECK(bad[path] == 0);
  }
  // BOS / EOS / add_bos as transformers' AutoTokenizer has them (model folders, when installed).
  for (const json& c : j.value("configs", json::array())) {
    const Tokenizer t = Tokenizer::load(c["path"].get<std::string>());
    INFO(c.dump(), " vs ", t.describe());
    CHECK(t.bos_id() == (c["bos"].is_null() ? std::nullopt : std::optional<int32_t>(c["bos"].get<int32_t>())));
    CHECK(t.eos_id() == (c["eos"].is_null() ? std::nullopt : std::optional<int32_t>(c["eos"].get<int32_t>())));
    CHECK(t.add_bos() == c["add_bos"].get<bool>());
  }
}
