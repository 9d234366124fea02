#include "data/fast_llm_dataset.h"

#include <limits>
#include <nlohmann/json.hpp>

namespace engine {

using nlohmann::json;

namespace fast_llm_detail {

constexpr std::string_view kHeader = "fast_llm_prepared_dataset";
constexpr uint64_t kDataBegin = 33;  // 25-byte header + u64 config offset
constexpr std::string_view kLmBegin = "lm begin", kLmEnd = "lm end";
constexpr std::string_view kTokenBegin = "token begin", kTokenEnd = "token end";
constexpr std::string_view kRangeBegin = "range begin", kRangeEnd = "range end";
constexpr std::string_view kPatchBegin = "patch begin", kPatchEnd = "patch end";

// Field access on the JSON config: any problem is an error at the config's offset naming the
// field path.
struct ConfigReader {
  const std::string& file;
  uint64_t offset;  // of the JSON text

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    file_error(file, offset, str_cat("config field \"", field, "\": ", what));
  }
  const json& object(const json& j, const std::string& key, const std::string& field) const {
    auto it = j.find(key);
    if (it == j.end()) fail(field, "missing");
    if (!it->is_object()) fail(field, "expected an object");
    return *it;
  }
  uint64_t u64(const json& j, const std::string& key, const std::string& field) const {
    auto it = j.find(key);
    if (it == j.end()) fail(field, "missing");
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
      fail(field, "expected a non-negative integer");
    return it->get<uint64_t>();
  }
  std::string type(const json& j, const std::string& field, const char* dflt) const {
    auto it = j.find("type");
    if (it == j.end()) return dflt;
    if (!it->is_string()) fail(field + ".type", "expected a string");
    return it->get<std::string>();
  }
};

bool token_type_from_name(const std::string& s, TokenType* out) {
  static const std::pair<const char*, TokenType> kTable[] = {
      {"uint8", TokenType::U8},   {"int8", TokenType::I8},   {"int16", TokenType::I16},
      {"uint16", TokenType::U16}, {"int32", TokenType::I32}, {"uint32", TokenType::U32},
      {"int64", TokenType::I64}};
  for (auto& [name, t] : kTable)
    if (s == name) {
      *out = t;
      return true;
    }
  return false;
}

struct Section {
  uint64_t begin = 0, end = 0;
};

// A section [begin, end) from the config: inside `lo..hi`, framed by its markers, of size
// `expected` bytes in all.
Section section(const MappedFile& f, const ConfigReader& cr, const json& j, const std::string& field,
                std::string_view header, std::string_view footer, uint64_t lo, uint64_t hi,
                uint64_t expected) {
  Section s{cr.u64(j, "begin", field + ".begin"), cr.u64(j, "end", field + ".end")};
  if (s.begin < lo || s.end > hi || s.begin > s.end)
    cr.fail(field, str_cat("section [", s.begin, ", ", s.end, ") is outside [", lo, ", ", hi, ")"));
  if (s.end - s.begin != expected)
    cr.fail(field, str_cat("section [", s.begin, ", ", s.end, ") has ", s.end - s.begin,
                           " bytes, expected ", expected, " from its counts"));
  f.expect_marker(s.begin, header);
  f.expect_marker(s.end - footer.size(), footer);
  return s;
}

// Checks a cumulative array: c[0] = 0, non-decreasing, c[n] = total.
template <typename T>
void check_cumsum(const MappedFile& f, uint64_t off, uint64_t n, uint64_t total, const char* what) {
  const unsigned char* p = f.data() + off;
  int64_t prev = 0;
  for (uint64_t i = 0; i <= n; ++i) {
    int64_t v = load_le<T>(p, i);
    if ((i == 0 && v != 0) || v < prev)
      file_error(f.path(), off + i * sizeof(T),
                 str_cat(what, "[", i, "] = ", v, ": expected a non-decreasing sequence from 0"));
    prev = v;
  }
  if (static_cast<uint64_t>(prev) != total)
    file_error(f.path(), off + n * sizeof(T),
               str_cat(what, "[", n, "] = ", prev, ": expected the total ", total));
}

}  // namespace fast_llm_detail

using namespace fast_llm_detail;

FastLLMDataset::FastLLMDataset(const std::string& path) : file_(path) {
  path_ = path;
  const MappedFile& f = file_;
  f.require(0, kDataBegin, "the header");
  if (std::memcmp(f.data(), kHeader.data(), kHeader.size()) != 0)
    file_error(path, 0, "bad magic: expected \"fast_llm_prepared_dataset\"");
  uint64_t config_offset = f.be<uint64_t>(kHeader.size(), "the config offset");
  if (config_offset < kDataBegin || config_offset > f.size() || f.size() - config_offset < 4)
    file_error(path, kHeader.size(), str_cat("config offset ", config_offset, " is outside [",
                                             kDataBegin, ", file size ", f.size(), " - 4]"));
  uint64_t length = f.be<uint32_t>(config_offset, "the config length");
  uint64_t json_off = config_offset + 4;
  f.require(json_off, length, "the JSON config");
  json cfg;
  try {
    cfg = json::parse(f.data() + json_off, f.data() + json_off + length);
  } catch (const json::exception& e) {
    file_error(path, json_off, str_cat("bad JSON config: ", e.what()));
  }
  ConfigReader cr{path, json_off};
  if (!cfg.is_object()) cr.fail("(root)", "expected an object");
  if (std::string t = cr.type(cfg, "(root)", "language_model"); t != "language_model")
    cr.fail("type", str_cat("expected \"language_model\", got \"", t, "\""));

  // The lm section: its size is implied by the sections inside; check the frame here.
  Section lm{cr.u64(cfg, "begin", "begin"), cr.u64(cfg, "end", "end")};
  if (lm.begin < kDataBegin || lm.end > config_offset || lm.begin > lm.end ||
      lm.end - lm.begin < kLmBegin.size() + kLmEnd.size())
    cr.fail("begin/end", str_cat("lm section [", lm.begin, ", ", lm.end, ") is outside [",
                                 kDataBegin, ", config offset ", config_offset, ")"));
  f.expect_marker(lm.begin, kLmBegin);
  f.expect_marker(lm.end - kLmEnd.size(), kLmEnd);
  const uint64_t lo = lm.begin + kLmBegin.size(), hi = lm.end - kLmEnd.size();

  // Tokens.
  const json& tok = cr.object(cfg, "tokens", "tokens");
  if (std::string t = cr.type(tok, "tokens", "token"); t != "token")
    cr.fail("tokens.type", str_cat("expected \"token\", got \"", t, "\""));
  uint64_t n = cr.u64(tok, "num_documents", "tokens.num_documents");
  uint64_t total = cr.u64(tok, "num_tokens", "tokens.num_tokens");
  auto dt = tok.find("data_type");
  if (dt == tok.end() || !dt->is_string()) cr.fail("tokens.data_type", "expected a string");
  if (!token_type_from_name(dt->get<std::string>(), &type_))
    cr.fail("tokens.data_type", str_cat("unsupported token data_type \"", dt->get<std::string>(),
                                        "\": expected uint8, int8, int16, uint16, int32, uint32 or int64"));
  if (n >= f.size() || total >= f.size())  // bounds the arithmetic below
    cr.fail("tokens", str_cat("num_documents ", n, " / num_tokens ", total, " exceed the file size ", f.size()));
  const uint64_t item = static_cast<uint64_t>(token_type_size(type_));
  uint64_t tok_bytes = kTokenBegin.size() + total * item + (n + 1) * 8 + kTokenEnd.size();
  Section ts = section(f, cr, tok, "tokens", kTokenBegin, kTokenEnd, lo, hi, tok_bytes);
  tokens_ = f.data() + ts.begin + kTokenBegin.size();
  uint64_t cumsum_off = ts.begin + kTokenBegin.size() + total * item;
  size_cumsum_ = f.data() + cumsum_off;
  check_cumsum<int64_t>(f, cumsum_off, n, total, "size_cumsum");
  num_documents_ = static_cast<int64_t>(n);
  num_tokens_ = static_cast<int64_t>(total);

  // Sections this reader does not read (Fast-LLM's reinforcement-learning token data) are
  // refused where the file has them, never dropped.
  for (const char* name : {"advantages", "old_log_probabilities"}) {
    auto it = cfg.find(name);
    if (it == cfg.end()) continue;
    if (!it->is_object()) cr.fail(name, "expected an object");
    if (std::string t = cr.type(*it, name, "none"); t != "none")
      cr.fail(str_cat(name, ".type"), str_cat("a \"", t, "\" section, which this engine does not read yet (",
                                              "only \"none\" there): the dataset's ", name, " would be lost"));
  }

  // Optional range sections, in file order after the tokens.
  uint64_t prev_end = ts.end;
  for (const char* name : {"loss_masking_spans", "chosen_spans", "rejected_spans"}) {
    auto it = cfg.find(name);
    if (it == cfg.end()) continue;
    if (!it->is_object()) cr.fail(name, "expected an object");
    std::string t = cr.type(*it, name, "none");
    if (t == "none") continue;
    if (t != "range") cr.fail(str_cat(name, ".type"), str_cat("expected \"range\" or \"none\", got \"", t, "\""));
    std::string fn = name;
    if (cr.u64(*it, "num_documents", fn + ".num_documents") != n)
      cr.fail(fn + ".num_documents", str_cat("expected ", n, " (tokens.num_documents)"));
    uint64_t r = cr.u64(*it, "num_ranges", fn + ".num_ranges");
    if (r >= f.size() || n >= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
      cr.fail(fn + ".num_ranges", str_cat(r, " ranges exceed the file size ", f.size()));
    uint64_t bytes = kRangeBegin.size() + r * 8 + (n + 1) * 4 + kRangeEnd.size();
    Section rs = section(f, cr, *it, fn, kRangeBegin, kRangeEnd, prev_end, hi, bytes);
    prev_end = rs.end;
    uint64_t ranges_off = rs.begin + kRangeBegin.size(), counts_off = ranges_off + r * 8;
    check_cumsum<int32_t>(f, counts_off, n, r, (fn + " count_cumsum").c_str());
    if (fn != "loss_masking_spans") continue;  // preference spans: structure only
    has_spans_ = true;
    ranges_ = f.data() + ranges_off;
    range_cumsum_ = f.data() + counts_off;
    for (int64_t d = 0; d < num_documents_; ++d) {
      int64_t size = document_size(d);
      for (int64_t s = load_le<int32_t>(range_cumsum_, d); s < load_le<int32_t>(range_cumsum_, d + 1); ++s) {
        int32_t b = load_le<int32_t>(ranges_, 2 * s), e = load_le<int32_t>(ranges_, 2 * s + 1);
        if (b < 0 || e < b || e > size)
          file_error(path, ranges_off + 8 * s,
                     str_cat("loss-masking span [", b, ", ", e, ") of document ", d,
                             " is outside the document's ", size, " tokens"));
      }
    }
  }
  read_image_patches(cr, cfg, prev_end, hi);
}

// image_patches (Fast-LLM's "patch" section), after the range sections: "patch begin",
// pixels[P][patch size] u8, token_map i32[P] (each patch's token in its document),
// positions i32[P][grid dims], patch_count_cumsum i32[N+1], group_lengths i32[G] (patches an
// image), group_count_cumsum i32[N+1] (images a document), "patch end".
void FastLLMDataset::read_image_patches(const ConfigReader& cr, const json& cfg, uint64_t lo, uint64_t hi) {
  auto it = cfg.find("image_patches");
  if (it == cfg.end()) return;
  const std::string fn = "image_patches";
  if (!it->is_object()) cr.fail(fn, "expected an object");
  const std::string t = cr.type(*it, fn, "none");
  if (t == "none") return;
  if (t != "patch") cr.fail(fn + ".type", str_cat("expected \"patch\" or \"none\", got \"", t, "\""));
  const MappedFile& f = file_;
  const uint64_t n = static_cast<uint64_t>(num_documents_);
  if (cr.u64(*it, "num_documents", fn + ".num_documents") != n)
    cr.fail(fn + ".num_documents", str_cat("expected ", n, " (tokens.num_documents)"));
  auto dt = it->find("data_type");
  if (dt == it->end() || !dt->is_string() || dt->get<std::string>() != "uint8")
    cr.fail(fn + ".data_type", "expected \"uint8\" (pixels)");
  auto shape = it->find("patch_shape");
  if (shape == it->end() || !shape->is_array() || shape->size() < 2 || shape->size() > 4)
    cr.fail(fn + ".patch_shape", "expected an array of 2 to 4 sizes (channels, then the grid's dims)");
  uint64_t patch_bytes = 1;
  std::vector<int64_t> dims;
  for (const json& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() == 0 || d.get<uint64_t>() > (1u << 16))
      cr.fail(fn + ".patch_shape", str_cat("expected sizes in [1, 65536], got ", shape->dump()));
    dims.push_back(d.get<int64_t>());
    patch_bytes *= d.get<uint64_t>();
  }
  const uint64_t grid = dims.size() - 1;
  const uint64_t P = cr.u64(*it, "num_patches", fn + ".num_patches");
  const uint64_t G = cr.u64(*it, "num_patch_groups", fn + ".num_patch_groups");
  if (P >= f.size() || G >= f.size() || P * patch_bytes >= f.size() ||
      P >= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    cr.fail(fn, str_cat(P, " patches of ", patch_bytes, " bytes / ", G, " images exceed the file size ", f.size()));
  const uint64_t bytes =
      kPatchBegin.size() + P * patch_bytes + ((1 + grid) * P + G + 2 * n + 2) * 4 + kPatchEnd.size();
  const Section ps = section(f, cr, *it, fn, kPatchBegin, kPatchEnd, lo, hi, bytes);
  const uint64_t pixels = ps.begin + kPatchBegin.size(), token_map = pixels + P * patch_bytes;
  const uint64_t positions = token_map + P * 4, patch_cumsum = positions + grid * P * 4;
  const uint64_t lengths = patch_cumsum + (n + 1) * 4, group_cumsum = lengths + G * 4;
  check_cumsum<int32_t>(f, patch_cumsum, n, P, "image_patches patch_count_cumsum");
  check_cumsum<int32_t>(f, group_cumsum, n, G, "image_patches group_count_cumsum");
  // Every patch names a token of its document and a non-negative grid position; each
  // document's images hold its patches.
  for (int64_t d = 0; d < num_documents_; ++d) {
    const int64_t p0 = load_le<int32_t>(f.data() + patch_cumsum, d), p1 = load_le<int32_t>(f.data() + patch_cumsum, d + 1);
    const int64_t size = document_size(d);
    for (int64_t q = p0; q < p1; ++q) {
      const int32_t tok = load_le<int32_t>(f.data() + token_map, q);
      if (tok < 0 || tok >= size)
        file_error(path_, token_map + 4 * q, str_cat("image patch ", q, " of document ", d, " names token ", tok,
                                                     ", outside the document's ", size, " tokens"));
      for (uint64_t g = 0; g < grid; ++g)
        if (load_le<int32_t>(f.data() + positions, q * grid + g) < 0)
          file_error(path_, positions + 4 * (q * grid + g), str_cat("image patch ", q, " has a negative position"));
    }
    int64_t in_images = 0;
    for (int64_t g = load_le<int32_t>(f.data() + group_cumsum, d); g < load_le<int32_t>(f.data() + group_cumsum, d + 1);
         ++g) {
      const int32_t len = load_le<int32_t>(f.data() + lengths, g);
      if (len <= 0) file_error(path_, lengths + 4 * g, str_cat("image ", g, " has ", len, " patches"));
      in_images += len;
    }
    if (in_images != p1 - p0)
      file_error(path_, group_cumsum + 4 * d, str_cat("document ", d, "'s images hold ", in_images,
                                                      " patches, its patch count is ", p1 - p0));
  }
  patch_shape_ = dims;
  patch_bytes_ = static_cast<int64_t>(patch_bytes);
  patch_pixels_ = f.data() + pixels;
  patch_token_map_ = f.data() + token_map;
  patch_positions_ = f.data() + positions;
  patch_cumsum_ = f.data() + patch_cumsum;
  group_lengths_ = f.data() + lengths;
  group_cumsum_ = f.data() + group_cumsum;
}

DocumentPatches FastLLMDataset::image_patches(int64_t doc) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range [0, ", num_documents_, ")");
  DocumentPatches out;
  if (!has_image_patches()) return out;
  const int64_t p0 = load_le<int32_t>(patch_cumsum_, doc), p1 = load_le<int32_t>(patch_cumsum_, doc + 1);
  const int64_t grid = static_cast<int64_t>(patch_shape_.size()) - 1;
  out.count = p1 - p0;
  out.pixels = patch_pixels_ + p0 * patch_bytes_;
  for (int64_t q = p0; q < p1; ++q) {
    out.token_index.push_back(load_le<int32_t>(patch_token_map_, q));
    for (int64_t g = 0; g < grid; ++g) out.positions.push_back(load_le<int32_t>(patch_positions_, q * grid + g));
  }
  for (int64_t g = load_le<int32_t>(group_cumsum_, doc); g < load_le<int32_t>(group_cumsum_, doc + 1); ++g)
    out.image_lengths.push_back(load_le<int32_t>(group_lengths_, g));
  return out;
}

int64_t FastLLMDataset::document_size(int64_t doc) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range [0, ",
         num_documents_, ")");
  return load_le<int64_t>(size_cumsum_, doc + 1) - load_le<int64_t>(size_cumsum_, doc);
}

const unsigned char* FastLLMDataset::document_data(int64_t doc) const {
  return tokens_ + load_le<int64_t>(size_cumsum_, doc) * token_type_size(type_);
}

std::vector<TokenSpan> FastLLMDataset::loss_masking_spans(int64_t doc) const {
  ENSURE(doc >= 0 && doc < num_documents_, path_, ": document ", doc, " out of range");
  std::vector<TokenSpan> out;
  if (!has_spans_) return out;
  for (int64_t s = load_le<int32_t>(range_cumsum_, doc); s < load_le<int32_t>(range_cumsum_, doc + 1); ++s) {
    int64_t b = load_le<int32_t>(ranges_, 2 * s), e = load_le<int32_t>(ranges_, 2 * s + 1);
    if (e > b) out.push_back({b, e});
  }
  return out;
}

}  // namespace engine
