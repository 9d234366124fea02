// Sampling: determinism, independence from access order and thread, the invariants of
// truncated and packed samples, loss-masking spans, blending proportions, the valid_fraction
// split, out-of-vocabulary tokens. Datasets use globally unique token ids, so every token tells
// which document and offset it came from.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "data/dataset_writer.h"
#include "data/sampler.h"
#include "tests/common/testing.h"
#include "tests/data/data_test_util.h"

namespace engine {
namespace {

// Documents whose tokens are the consecutive ids base, base + 1, ...; `where` maps an id back.
// Lengths are drawn from [min_len, max_len] by the test seed and the file's name (not its
// directory, which holds the process id: a failing seed must replay); first_max_len > 0 caps
// the first document's, so that a set surely holds a document that fits a short sequence.
struct UniqueData {
  std::string path;
  std::vector<std::vector<int32_t>> docs;
  std::vector<std::vector<TokenSpan>> spans;
  std::map<int32_t, std::pair<int, int>> where;  // id -> (document, offset)
  int32_t end_id = 0;

  bool in_span(int32_t id) const {
    auto [d, o] = where.at(id);
    if (spans.empty()) return false;
    for (const TokenSpan& s : spans[static_cast<size_t>(d)])
      if (o >= s.begin && o < s.end) return true;
    return false;
  }
};

UniqueData unique_data(const std::string& path, int count, int min_len, int max_len, int32_t base,
                       bool with_spans, int vocab, int first_max_len = 0) {
  UniqueData u;
  u.path = path;
  PhiloxKey key = testing::test_key("unique " + std::filesystem::path(path).filename().string());
  uint64_t c = 0;
  int32_t id = base;
  for (int d = 0; d < count; ++d) {
    const int hi = d == 0 && first_max_len > 0 ? std::min(first_max_len, max_len) : max_len;
    int len = min_len + static_cast<int>(philox_below(key, c++, static_cast<uint64_t>(hi - min_len + 1)));
    std::vector<int32_t> doc;
    for (int o = 0; o < len; ++o) {
      u.where[id] = {d, o};
      doc.push_back(id++);
    }
    u.docs.push_back(doc);
    if (with_spans) {
      std::vector<TokenSpan> s;
      if (len > 2 && philox_below(key, c++, 2)) {
        int64_t b = static_cast<int64_t>(philox_below(key, c++, static_cast<uint64_t>(len - 1)));
        s.push_back({b, b + 1 + static_cast<int64_t>(philox_below(key, c++, static_cast<uint64_t>(len - b)))});
      }
      u.spans.push_back(s);
    }
  }
  u.end_id = id;
  write_token_dataset(path, u.docs, vocab, u.spans);
  return u;
}

bool same(const Sample& a, const Sample& b) {
  return a.tokens == b.tokens && a.loss_mask == b.loss_mask && a.doc_lengths == b.doc_lengths &&
         a.padding == b.padding;
}

// Checks the shape of a sample and that each doc_lengths piece is a run of consecutive ids of
// one document; in packed mode also that pieces are whole documents and padding is zeros.
void check_sample(const Sample& s, int S, const UniqueData& u, bool packed) {
  REQUIRE(s.tokens.size() == static_cast<size_t>(S + 1));
  REQUIRE(s.loss_mask.size() == static_cast<size_t>(S));
  int sum = 0;
  for (int32_t l : s.doc_lengths) {
    CHECK(l > 0);
    sum += l;
  }
  CHECK(sum == S);
  size_t pos = 0;
  for (size_t p = 0; p < s.doc_lengths.size(); ++p) {
    const int len = s.doc_lengths[p];
    if (packed && p + 1 == s.doc_lengths.size() && s.padding > 0) {
      CHECK(len == s.padding);
      for (size_t i = pos; i <= static_cast<size_t>(S); ++i) CHECK(s.tokens[i] == 0);
      break;
    }
    auto [d, o] = u.where.at(s.tokens[pos]);
    if (pos > 0 || packed) CHECK(o == 0);  // a piece after a boundary starts its document
    for (int i = 1; i < len; ++i) CHECK(s.tokens[pos + static_cast<size_t>(i)] == s.tokens[pos] + i);
    const int doc_size = static_cast<int>(u.docs[static_cast<size_t>(d)].size());
    if (packed) {
      // Whole documents; only the one that reaches position S may have its last token there.
      if (pos + static_cast<size_t>(len) < static_cast<size_t>(S)) CHECK(doc_size == len);
      else CHECK((doc_size == len || doc_size == len + 1));
    }
    pos += static_cast<size_t>(len);
  }
}

// The expected loss mask from the ids: 0 for labels in a span, on padding, and for the last
// real token before padding.
std::vector<uint8_t> expected_mask(const Sample& s, const UniqueData& u) {
  std::vector<uint8_t> m(s.loss_mask.size(), 1);
  for (size_t i = 0; i < m.size(); ++i) {
    int32_t label = s.tokens[i + 1];
    if (label == 0 || u.in_span(label)) m[i] = 0;
  }
  return m;
}

TEST_CASE("sampling: deterministic, independent of access order, threads and num_samples") {
  std::string dir = data_testing::data_test_dir("determinism");
  UniqueData u = unique_data(dir + "/a", 37, 1, 29, 1, true, 5000);
  // Sequence length 13: with truncate_documents = false a set needs a document of <= 14 tokens.
  UniqueData v = unique_data(dir + "/b.fast_llm_dataset", 19, 3, 51, 3000, false, 5000, 14);
  for (bool truncate : {true, false}) {
    CAPTURE(truncate);
    Config c = data_testing::data_config({u.path, v.path}, 13, 5000, truncate, {2, 1});
    const int64_t n = 300;
    auto a = make_sample_source(c, Split::Train, n);
    auto b = make_sample_source(c, Split::Train, n);
    auto longer = make_sample_source(c, Split::Train, 3 * n);
    REQUIRE(a->num_samples() == n);
    std::vector<Sample> seq(n);
    for (int64_t i = 0; i < n; ++i) seq[static_cast<size_t>(i)] = a->get(i);
    for (int64_t i = n - 1; i >= 0; --i) CHECK(same(b->get(i), seq[static_cast<size_t>(i)]));
    for (int64_t i = 0; i < n; i += 7) CHECK(same(longer->get(i), seq[static_cast<size_t>(i)]));
    std::vector<Sample> par(n);
#pragma omp parallel for schedule(dynamic, 3) num_threads(4)
    for (int64_t i = 0; i < n; ++i) par[static_cast<size_t>(i)] = b->get(n - 1 - i);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) mismatches += same(par[static_cast<size_t>(i)], seq[static_cast<size_t>(n - 1 - i)]) ? 0 : 1;
    CHECK(mismatches == 0);
    // A different seed gives different samples.
    Config c2 = c;
    c2.run.seed = c.run.seed + 1;
    auto other = make_sample_source(c2, Split::Train, n);
    int differ = 0;
    for (int64_t i = 0; i < 20; ++i) differ += same(other->get(i), seq[static_cast<size_t>(i)]) ? 0 : 1;
    CHECK(differ > 10);
    CHECK_THROWS_AS(a->get(n), Error);
    CHECK_THROWS_AS(a->get(-1), Error);
  }
}

TEST_CASE("sampling: truncate_documents = true cuts one stream into overlapping samples") {
  std::string dir = data_testing::data_test_dir("truncate");
  const int S = 16;
  UniqueData u = unique_data(dir + "/a", 53, 0, 40, 1, true, 4000);
  int64_t total = static_cast<int64_t>(u.where.size());
  const int64_t n = total / S;  // about one epoch
  Config c = data_testing::data_config({u.path}, S, 4000, true);
  auto src = make_sample_source(c, Split::Train, n);
  std::multiset<int32_t> inputs;
  std::multiset<int32_t> firsts, lasts;
  for (int64_t i = 0; i < n; ++i) {
    Sample s = src->get(i);
    check_sample(s, S, u, false);
    CHECK(s.padding == 0);
    CHECK(s.loss_mask == expected_mask(s, u));
    inputs.insert(s.tokens.begin(), s.tokens.end() - 1);
    firsts.insert(s.tokens[0]);
    lasts.insert(s.tokens[S]);
  }
  // The first epoch's n * S input positions: every token at most once.
  CHECK(inputs.size() == static_cast<size_t>(n * S));
  CHECK(std::set<int32_t>(inputs.begin(), inputs.end()).size() == inputs.size());
  // Sample k's label token S is sample k + 1's first token: all but one last token is a first.
  int64_t linked = 0;
  for (int32_t t : lasts) linked += firsts.count(t) ? 1 : 0;
  CHECK(linked >= n - 1);
}

TEST_CASE("sampling: truncate_documents = false packs whole documents and pads") {
  std::string dir = data_testing::data_test_dir("packed");
  const int S = 24;
  UniqueData u = unique_data(dir + "/a", 61, 1, 31, 1, true, 4000);
  int too_long = 0;
  for (auto& d : u.docs) too_long += d.size() > static_cast<size_t>(S + 1) ? 1 : 0;
  REQUIRE(too_long > 0);
  Config c = data_testing::data_config({u.path}, S, 4000, false);
  const int64_t n = 200;
  auto src = make_sample_source(c, Split::Train, n);
  CHECK(src->describe().find(str_cat("skipped ", too_long, " documents longer than sequence_length + 1 = 25")) != std::string::npos);
  int64_t padded = 0, real_tokens = 0;
  for (int64_t i = 0; i < n; ++i) {
    Sample s = src->get(i);
    check_sample(s, S, u, true);
    CHECK(s.padding >= 0);
    int real = S + 1;
    while (real > 0 && s.tokens[static_cast<size_t>(real - 1)] == 0) --real;
    CHECK(s.padding == std::max(0, S - real));
    for (int t = 0; t < real; ++t)
      CHECK(u.docs[static_cast<size_t>(u.where.at(s.tokens[static_cast<size_t>(t)]).first)].size() <= static_cast<size_t>(S + 1));
    std::vector<uint8_t> m = expected_mask(s, u);
    CHECK(s.loss_mask == m);
    if (real <= S) CHECK(s.loss_mask[static_cast<size_t>(real - 1)] == 0);
    padded += s.padding > 0 ? 1 : 0;
    real_tokens += real;
  }
  CHECK(padded > 0);
  CHECK(real_tokens > n * (S + 1) / 2);  // greedy packing fills most of each sample
}

TEST_CASE("sampling: loss-masking spans clear exactly the labels inside them") {
  std::string dir = data_testing::data_test_dir("spans");
  const int S = 8;
  // Document 0: tokens 1..10 with the span [2, 5) -> ids 3, 4, 5 are never trained on.
  write_token_dataset(dir + "/s.fast_llm_dataset", {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}, 50, {{{2, 5}}});
  for (bool truncate : {true, false}) {
    Config c = data_testing::data_config({dir + "/s.fast_llm_dataset"}, S, 50, truncate);
    if (!truncate) c.data.sequence_length = 10;
    auto src = make_sample_source(c, Split::Train, 40);
    for (int64_t i = 0; i < 40; ++i) {
      Sample s = src->get(i);
      for (size_t p = 0; p + 1 < s.tokens.size(); ++p) {
        int32_t label = s.tokens[p + 1];
        bool masked = label >= 3 && label <= 5;
        if (!truncate && p + 1 >= 10) masked = true;  // padding label (and the last real token)
        CHECK(s.loss_mask[p] == (masked ? 0 : 1));
      }
    }
  }
}

TEST_CASE("sampling: blending follows the weights within 1% over 10k samples") {
  std::string dir = data_testing::data_test_dir("blend");
  UniqueData a = unique_data(dir + "/a", 40, 1, 20, 1, false, 3000);
  UniqueData b = unique_data(dir + "/b", 7, 1, 9, 1000, false, 3000);
  UniqueData d = unique_data(dir + "/d.fast_llm_dataset", 30, 5, 40, 2000, false, 3000);
  const std::vector<double> w = {5, 3, 2};
  Config c = data_testing::data_config({a.path, b.path, d.path}, 6, 3000, true, w);
  const int64_t n = 10000;
  auto src = make_sample_source(c, Split::Train, n);
  int64_t counts[3] = {0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    int32_t t = src->get(i).tokens[0];
    counts[t >= 2000 ? 2 : t >= 1000 ? 1 : 0]++;
    if (i == 99) {  // every prefix is within one sample of the exact share
      CHECK(std::abs(counts[0] - 50) <= 1);
      CHECK(std::abs(counts[1] - 30) <= 1);
      CHECK(std::abs(counts[2] - 20) <= 1);
    }
  }
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(std::abs(static_cast<double>(counts[k]) / n - w[k] / 10) < 0.01);
  }
  std::string desc = src->describe();
  CHECK(desc.find(a.path + ": 40 documents") != std::string::npos);
  CHECK(std::count(desc.begin(), desc.end(), '\n') == 2);
}

TEST_CASE("sampling: valid_fraction splits documents into disjoint train and valid sets") {
  std::string dir = data_testing::data_test_dir("valid");
  UniqueData u = unique_data(dir + "/a", 50, 2, 12, 1, false, 2000);
  UniqueData v = unique_data(dir + "/b.fast_llm_dataset", 20, 2, 12, 1000, false, 2000);
  Config c = data_testing::data_config({u.path, v.path}, 5, 2000, true);
  CHECK(make_sample_source(c, Split::Valid, 10) == nullptr);
  c.data.valid_fraction = 0.2;
  auto train = make_sample_source(c, Split::Train, 400);
  auto valid = make_sample_source(c, Split::Valid, 200);
  REQUIRE(valid != nullptr);
  auto docs_of = [&](const SampleSource& s) {
    std::set<std::pair<int, int>> docs;  // (dataset, document)
    for (int64_t i = 0; i < s.num_samples(); ++i)
      for (int32_t t : s.get(i).tokens) {
        int ds = t >= 1000 ? 1 : 0;
        docs.insert({ds, (ds ? v : u).where.at(t).first});
      }
    return docs;
  };
  std::set<std::pair<int, int>> tr = docs_of(*train), va = docs_of(*valid);
  for (auto& d : va) CHECK(tr.count(d) == 0);
  CHECK(va.size() == 10 + 4);  // round(0.2 * 50) + round(0.2 * 20), all seen in 200 samples
  CHECK(tr.size() + va.size() == 70);
  // Same split from a fresh source; a configured data.valid takes precedence.
  CHECK(docs_of(*make_sample_source(c, Split::Valid, 200)) == va);
  c.data.valid = {{v.path, 1.0, 0}};
  auto explicit_valid = make_sample_source(c, Split::Valid, 100);
  CHECK(docs_of(*explicit_valid).size() == 20);
}

TEST_CASE("sampling: a token id >= vocab_size names the dataset, document and offset") {
  std::string dir = data_testing::data_test_dir("vocab");
  write_token_dataset(dir + "/a", {{1, 2, 3}, {4, 5, 6, 7, 399, 8}, {9}}, 400);
  Config c = data_testing::data_config({dir + "/a"}, 4, 399, true);
  auto src = make_sample_source(c, Split::Train, 3);
  int thrown = 0;
  for (int64_t i = 0; i < 3; ++i) {
    try {
      src->get(i);
    } catch (const Error& e) {
      ++thrown;
      CHECK(std::string(e.what()).find(str_cat("dataset ", dir, "/a: document 1, token offset 4: token id 399 >= model.vocab_size (399)")) != std::string::npos);
    }
  }
  CHECK(thrown >= 1);
}

TEST_CASE("sampling: configuration errors") {
  std::string dir = data_testing::data_test_dir("config_errors");
  write_token_dataset(dir + "/a", {{1, 2, 3}, {}}, 100);
  write_token_dataset(dir + "/long", {std::vector<int32_t>(50, 7)}, 100);
  Config c = data_testing::data_config({dir + "/a"}, 4, 100, true);
  CHECK(make_sample_source(c, Split::Train, 5)->num_samples() == 5);
  Config bad = c;
  bad.data.sequence_length = 0;
  CHECK_THROWS_WITH_AS(make_sample_source(bad, Split::Train, 5), doctest::Contains("data.sequence_length"), Error);
  bad = c;
  bad.data.train[0].weight = -1;
  CHECK_THROWS_WITH_AS(make_sample_source(bad, Split::Train, 5), doctest::Contains("data.train[0].weight"), Error);
  bad = c;
  bad.data.train.clear();
  CHECK_THROWS_WITH_AS(make_sample_source(bad, Split::Train, 5), doctest::Contains("data.train: no datasets"), Error);
  bad = data_testing::data_config({dir + "/long"}, 4, 100, false);
  CHECK_THROWS_WITH_AS(make_sample_source(bad, Split::Train, 5), doctest::Contains("none of its 1 documents fits"), Error);
  bad = c;
  bad.data.valid_fraction = 0.5;
  write_token_dataset(dir + "/one", {{1, 2, 3}}, 100);
  bad.data.train[0].path = dir + "/one";
  CHECK_THROWS_WITH_AS(make_sample_source(bad, Split::Valid, 5), doctest::Contains("at least 2 documents"), Error);
}

TEST_CASE("sampling: planning millions of tokens is fast" * doctest::test_suite("full")) {
  std::string dir = data_testing::data_test_dir("large");
  auto w = make_token_dataset_writer(dir + "/big", 50000);
  std::vector<int32_t> doc;
  PhiloxKey key = testing::test_key("large");
  for (int d = 0; d < 20000; ++d) {
    doc.assign(50 + philox_below(key, static_cast<uint64_t>(d), 400), d % 50000);
    w->add_document(doc);
  }
  w->finish();
  for (bool truncate : {true, false}) {
    Config c = data_testing::data_config({dir + "/big"}, 512, 50000, truncate);
    auto t0 = std::chrono::steady_clock::now();
    auto src = make_sample_source(c, Split::Train, 40000);  // ~4 epochs of ~5M tokens
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("planned 40000 samples (truncate = " << truncate << ") in " << s << " s");
    CHECK(s < 5.0);
    CHECK(src->get(39999).tokens.size() == 513);
  }
}

}  // namespace
}  // namespace engine
