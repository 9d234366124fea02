// scripts/prepare_data.py (and make_demo_corpus.py) produce datasets the C++ reader accepts:
// byte-level tokens, one end-of-document token 256 per document, uint16 on disk. Runs the
// python from $PYTHON (default python3); skipped when it is not available. The script's own tests
// (tests/data/prepare_tests.py: every input kind, tokenizers, kill and resume, bad input) run here
// too; the sharded chat output is read through its manifest and trained on by ./train.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "data/manifest_dataset.h"
#include "data/memmap_dataset.h"
#include "data/sampler.h"
#include "tests/common/process.h"
#include "tests/common/testing.h"
#include "tests/data/data_test_util.h"

namespace engine {
namespace {

// The repository root, from this file's path (tests/data/test_prepare_data.cpp; relative to the
// working folder when compiled with a relative path).
std::string repo_root() {
  std::string f = __FILE__;
  const std::string tail = "tests/data/test_prepare_data.cpp";
  if (f.size() >= tail.size() && f.compare(f.size() - tail.size(), tail.size(), tail) == 0)
    f.resize(f.size() - tail.size());
  return f.empty() ? "." : f;
}

// The python command, or "" (with a recorded skip) when it or the scripts are not available.
std::string python_or_skip() {
  if (!std::filesystem::exists(repo_root() + "/scripts/prepare_data.py")) {
    testing::skip_test("scripts/prepare_data.py not found (run the tests from the repository root)");
    return "";
  }
  const char* env = std::getenv("PYTHON");
  std::string py = env && *env ? env : "python3";
  // Found on PATH (or as a path) without starting it: python startup dominates this test.
  bool found = false;
  if (py.find('/') != std::string::npos) {
    found = ::access(py.c_str(), X_OK) == 0;
  } else if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    for (size_t b = 0, e; !found && b <= dirs.size(); b = e + 1) {
      e = dirs.find(':', b);
      if (e == std::string::npos) e = dirs.size();
      std::string dir = e > b ? dirs.substr(b, e - b) : ".";
      found = ::access((dir + "/" + py).c_str(), X_OK) == 0;
    }
  }
  if (!found) {
    testing::skip_test("no python (" + py + ") to run scripts/prepare_data.py");
    return "";
  }
  return py;
}

std::vector<int32_t> bytes_then_eos(const std::string& text) {
  std::vector<int32_t> t(text.begin(), text.end());
  for (auto& v : t) v &= 0xff;
  t.push_back(256);
  return t;
}

TEST_CASE("prepare_data.py: text and JSONL in, a .bin/.idx the C++ reader accepts") {
  std::string py = python_or_skip();
  if (py.empty()) return;
  std::string dir = data_testing::data_test_dir("prepare");
  std::string script = repo_root() + "/scripts/prepare_data.py";
  {
    std::ofstream f(dir + "/in.txt");
    f << "First paragraph,\nstill the first.\n\n\n   \nSecond: caf\xc3\xa9.\n\nThird\n";
  }
  {
    std::ofstream f(dir + "/in.jsonl");
    f << "{\"body\": \"alpha\", \"text\": \"ignored\"}\n\n{\"body\": \"\"}\n{\"body\": \"b\\u00e9ta\"}\n";
  }
  // One run over both inputs (python startup dominates the time of this test).
  std::string log = dir + "/log.txt";
  std::string cmd = py + " " + script + " " + dir + "/in.txt " + dir + "/in.jsonl --field body --output " +
                    dir + "/out > " + log + " 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
  auto ds = open_token_dataset(dir + "/out");
  CHECK(dynamic_cast<const MemmapDataset&>(*ds).version() == 1);
  CHECK(ds->token_type() == TokenType::U16);
  REQUIRE(ds->num_documents() == 6);
  CHECK(ds->read(0) == bytes_then_eos("First paragraph,\nstill the first."));
  CHECK(ds->read(1) == bytes_then_eos("Second: caf\xc3\xa9."));
  CHECK(ds->read(2) == bytes_then_eos("Third"));
  CHECK(ds->read(3) == bytes_then_eos("alpha"));
  CHECK(ds->read(4) == std::vector<int32_t>{256});
  CHECK(ds->read(5) == bytes_then_eos("b\xc3\xa9ta"));
  std::ifstream out(log);
  std::string printed((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  CHECK(printed.find("documents: 6") != std::string::npos);
  CHECK(printed.find("vocab: 257") != std::string::npos);
}

TEST_CASE("prepare_data.py: a bad input fails and leaves no output" * doctest::test_suite("full")) {
  std::string py = python_or_skip();
  if (py.empty()) return;
  std::string dir = data_testing::data_test_dir("prepare_bad");
  {
    std::ofstream f(dir + "/in.jsonl");
    f << "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n";
  }
  std::string cmd = py + " " + repo_root() + "/scripts/prepare_data.py " + dir + "/in.jsonl -o " + dir +
                    "/bad > " + dir + "/log.txt 2>&1";
  CHECK(std::system(cmd.c_str()) != 0);
  CHECK(!std::filesystem::exists(dir + "/bad.bin"));
  CHECK(!std::filesystem::exists(dir + "/bad.idx"));
  CHECK(std::filesystem::is_empty(dir) == false);
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 2);  // in.jsonl and log.txt: no temporary left behind
}

TEST_CASE("prepare_data.py: a write that fails (the file size limit) names the file; the previous output stays" *
          doctest::test_suite("full")) {
  std::string py = python_or_skip();
  if (py.empty()) return;
  std::string dir = data_testing::data_test_dir("prepare_full");
  std::string script = repo_root() + "/scripts/prepare_data.py";
  {
    std::ofstream f(dir + "/small.txt");
    f << "short\n";
    std::ofstream g(dir + "/big.txt");
    for (int i = 0; i < 400; ++i) g << "paragraph " << i << " of a corpus bigger than the limit\n\n";
  }
  REQUIRE(std::system((py + " " + script + " " + dir + "/small.txt -o " + dir + "/out > /dev/null").c_str()) == 0);
  const auto bin = std::filesystem::file_size(dir + "/out.bin");
  // bash's ulimit -f counts KiB: writes past 1 KiB fail with EFBIG (python ignores SIGXFSZ).
  std::string log = dir + "/log.txt";
  std::string cmd = "bash -c 'ulimit -f 1 && exec " + py + " " + script + " " + dir + "/big.txt -o " + dir +
                    "/out' > " + log + " 2>&1";
  CHECK(std::system(cmd.c_str()) != 0);
  std::ifstream in(log);
  std::string printed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(printed);
  CHECK(printed.find("error: cannot write " + dir + "/out.bin.tmp.") != std::string::npos);
  CHECK(printed.find("File too large") != std::string::npos);
  CHECK(printed.find("Traceback") == std::string::npos);
  CHECK(std::filesystem::file_size(dir + "/out.bin") == bin);
  for (auto& e : std::filesystem::directory_iterator(dir))
    CHECK(e.path().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("make_demo_corpus.py -> prepare_data.py: 3000 documents" * doctest::test_suite("full")) {
  std::string py = python_or_skip();
  if (py.empty()) return;
  std::string dir = data_testing::data_test_dir("demo_corpus");
  std::string root = repo_root();
  std::string cmd = py + " " + root + "/scripts/make_demo_corpus.py " + dir + "/demo.jsonl > /dev/null && " +
                    py + " " + root + "/scripts/prepare_data.py " + dir + "/demo.jsonl -o " + dir +
                    "/demo > /dev/null";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
  auto ds = open_token_dataset(dir + "/demo");
  CHECK(ds->num_documents() == 3000);
  CHECK(ds->num_tokens() > 100000);
  for (int64_t d = 0; d < ds->num_documents(); d += 97) {
    std::vector<int32_t> t = ds->read(d);
    REQUIRE(t.size() > 10);
    CHECK(t.back() == 256);
    for (size_t i = 0; i + 1 < t.size(); ++i) CHECK((t[i] >= 32 && t[i] < 127));  // ASCII text
  }
}

// Runs a unittest file of tests/data/; unittest lists each skip as "... skipped 'needs ...'":
// recorded, not hidden.
void run_python_tests(const std::string& py, const std::string& file) {
  const testing::ProcessResult r = testing::run_command(py + " " + repo_root() + "/tests/data/" + file + " -v 2>&1");
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::istringstream lines(r.output);
  std::string skips;
  for (std::string line; std::getline(lines, line);)
    if (auto at = line.find(" ... skipped "); at != std::string::npos) skips += "\n  " + line;
  if (!skips.empty()) MESSAGE(file << " skipped:" << skips);
  CHECK(r.output.find("\nOK") != std::string::npos);
}

TEST_CASE("prepare_data.py: its Python tests (tests/data/prepare_tests.py)" * doctest::test_suite("full")) {
  std::string py = python_or_skip();
  if (py.empty()) return;
  run_python_tests(py, "prepare_tests.py");
}

// The engine and hf tokenizer backends give equal output (needs ./tokenize from make all).
TEST_CASE("prepare_data.py: the tokenizer backends (tests/data/prepare_backend_tests.py)" * doctest::test_suite("full")) {
  std::string py = python_or_skip();
  if (py.empty()) return;
  run_python_tests(py, "prepare_backend_tests.py");
}

TEST_CASE("prepare_data.py: chat, sharded -> the manifest as data.train: spans masked, ./train trains" *
          doctest::test_suite("full")) {
  std::string py = python_or_skip();
  if (py.empty()) return;
  std::string dir = data_testing::data_test_dir("prepare_chat");
  {
    std::ofstream f(dir + "/chat.jsonl");
    for (int i = 0; i < 200; ++i)
      f << "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " << i << " plus " << i
        << "?\"}, {\"role\": \"assistant\", \"content\": \"" << 2 * i << ".\"}]}\n";
  }
  std::string cmd = py + " " + repo_root() + "/scripts/prepare_data.py " + dir + "/chat.jsonl --chat-field messages " +
                    "--shard-size 2000 --workers 2 -o " + dir + "/chat > " + dir + "/log.txt 2>&1";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
  const std::string manifest = dir + "/chat.manifest.json";
  auto ds = open_token_dataset(manifest);
  CHECK(dynamic_cast<const ManifestDataset&>(*ds).num_shards() > 3);
  REQUIRE(ds->num_documents() == 200);
  // Document 7: "<|user|>\nWhat is 7 plus 7?\n<|assistant|>\n" masked; "14.\n" and the EOS train.
  const std::string prompt = "<|user|>\nWhat is 7 plus 7?\n<|assistant|>\n";
  CHECK(ds->read(7) == bytes_then_eos(prompt + "14.\n"));
  CHECK(ds->loss_masking_spans(7) == std::vector<TokenSpan>{{0, static_cast<int64_t>(prompt.size())}});
  // Through the sampler: a label inside a span has mask 0, every other label of a document 1.
  Config c = data_testing::data_config({manifest}, 64, 257, /*truncate_documents=*/false);
  auto source = make_sample_source(c, Split::Train, 16);
  int64_t masked = 0, trained = 0;
  for (int64_t i = 0; i < source->num_samples(); ++i) {
    Sample x = source->get(i);
    for (size_t p = 0; p + x.padding < x.loss_mask.size(); ++p) {
      (x.loss_mask[p] ? trained : masked) += 1;
      // Labels that train are the answer digits, '.', '\n' and EOS; prompts hold letters.
      if (x.loss_mask[p]) CHECK(((x.tokens[p + 1] >= '0' && x.tokens[p + 1] <= '9') || x.tokens[p + 1] == '.' ||
                                 x.tokens[p + 1] == '\n' || x.tokens[p + 1] == 256));
    }
  }
  CHECK(masked > 3 * trained);
  CHECK(trained > 0);
  if (!std::filesystem::exists(testing::train_binary())) {
    testing::skip_test("no ./train binary (run from the repository root): the training part");
    return;
  }
  {
    std::ofstream f(dir + "/run.toml");
    f << "[run]\nname = \"chat\"\noutput_dir = \"" << dir << "/runs\"\nseed = 1\nlog_every = 1\ndevice = \"cpu\"\n"
      << "[model]\nfamily = \"gpt2\"\nvocab_size = 257\nhidden_size = 16\nnum_layers = 1\nnum_heads = 2\n"
      << "ffn_hidden_size = 32\n[data]\ntrain = [{ path = \"chat.manifest.json\" }]\nsequence_length = 64\n"
      << "truncate_documents = false\n[batch]\nmicro_batch_size = 2\nglobal_batch_size = 4\n[optimizer]\nlr = 1e-2\n"
      << "warmup_steps = 1\n[training]\nsteps = 3\n";
  }
  const testing::ProcessResult r = testing::run_command(testing::train_binary() + " " + dir + "/run.toml 2>&1");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("train data: " + manifest + ": 200 documents") != std::string::npos);
  CHECK(r.output.find("step 3/3 | loss") != std::string::npos);
}

}  // namespace
}  // namespace engine
