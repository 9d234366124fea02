// Tokenizer::load (tokenizer.h): tokenizer.json, then BOS / EOS / add_bos from the config files
// beside it. Precedence: tokenizer_config.json, special_tokens_map.json, generation_config.json,
// then tokenizer.json's post_processor (a TemplateProcessing that starts with a special token
// prepends it: that is BOS, and add_bos).
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/tokenizer_impl.h"

namespace engine {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) RAISE(path, ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    RAISE(path, ": not valid JSON: ", e.what());
  }
}

const json* key(const json& j, const char* k) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(k);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

void check_keys(const json& j, const std::string& where, std::initializer_list<const char*> known) {
  for (const auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* n : known) ok = ok || k == n;
    if (!ok) RAISE(where, ".", k, ": unknown key (the tokenizer reads only what it implements)");
  }
}

bool get_bool(const json& j, const char* k, bool def, const std::string& where) {
  const json* v = key(j, k);
  if (!v) return def;
  if (!v->is_boolean()) RAISE(where, ".", k, ": expected true or false, got ", v->dump());
  return v->get<bool>();
}

void read_added_tokens(const json& top, Tokenizer::Impl& t) {
  const json* list = key(top, "added_tokens");
  if (!list) return;
  if (!list->is_array()) RAISE(t.path, ": added_tokens: expected an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    const std::string at = str_cat(t.path, ": added_tokens[", i, "]");
    if (!e.is_object()) RAISE(at, ": expected an object");
    check_keys(e, at, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    const json* id = key(e, "id");
    const json* content = key(e, "content");
    if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= (int64_t{1} << 24))
      RAISE(at, ".id: expected an id in [0, 2^24), got ", id ? id->dump() : "nothing");
    if (!content || !content->is_string() || content->get<std::string>().empty())
      RAISE(at, ".content: expected a non-empty string");
    if (get_bool(e, "single_word", false, at))
      RAISE(at, ".single_word: true is not supported");
    AddedToken a;
    a.id = static_cast<int32_t>(id->get<int64_t>());
    a.content = a.match = content->get<std::string>();
    a.lstrip = get_bool(e, "lstrip", false, at);
    a.rstrip = get_bool(e, "rstrip", false, at);
    a.special = get_bool(e, "special", false, at);
    a.normalized = get_bool(e, "normalized", !a.special, at);
    if (auto mid = t.model->token_to_id(a.content); mid && *mid != a.id)
      RAISE(at, ": \"", a.content, "\" has id ", a.id, " but the model vocab gives it id ", *mid);
    for (const AddedToken& b : t.added) {
      if (b.content == a.content) RAISE(at, ": \"", a.content, "\" is listed twice");
      if (b.id == a.id) RAISE(at, ": id ", a.id, " is given to both \"", b.content, "\" and \"", a.content, "\"");
    }
    if (a.normalized) {
      a.match = tok::normalize(t.normalizer, a.content);
      a.content = a.match;  // tokenizers decodes a normalized added token as its normalized form
      if (a.match.empty()) RAISE(at, ": \"", content->get<std::string>(), "\" normalizes to nothing");
    }
    t.added_by_id[a.id] = t.added.size();
    t.added.push_back(std::move(a));
  }
  for (size_t i = 0; i < t.added.size(); ++i)
    (t.added[i].normalized ? t.normalized_trie : t.raw_trie).add(t.added[i].match, static_cast<int32_t>(i));
}

// post_processor: returns the id a TemplateProcessing prepends to a single sequence, if any.
std::optional<int32_t> template_bos(const json* pp, const std::string& where) {
  if (!pp) return std::nullopt;
  if (!pp->is_object() || !key(*pp, "type") || !(*pp)["type"].is_string())
    RAISE(where, ": expected an object with a \"type\"");
  const std::string type = (*pp)["type"].get<std::string>();
  if (type == "ByteLevel") return std::nullopt;
  if (type == "Sequence") {
    const json* list = key(*pp, "processors");
    if (!list || !list->is_array()) RAISE(where, ".processors: expected an array");
    std::optional<int32_t> bos;
    for (size_t i = 0; i < list->size(); ++i) {
      auto b = template_bos(&(*list)[i], str_cat(where, ".processors[", i, "]"));
      if (b) bos = b;
    }
    return bos;
  }
  if (type != "TemplateProcessing")
    RAISE(where, ".type: post-processor \"", type, "\" is not supported (ByteLevel, TemplateProcessing, Sequence)");
  const json* single = key(*pp, "single");
  if (!single || !single->is_array()) RAISE(where, ".single: expected an array");
  size_t leading = 0;
  std::string first;
  for (const json& piece : *single) {
    if (!piece.is_object() || piece.size() != 1) RAISE(where, ".single: bad piece ", piece.dump());
    if (piece.contains("Sequence")) break;
    const json* st = key(piece, "SpecialToken");
    if (!st || !key(*st, "id") || !(*st)["id"].is_string()) RAISE(where, ".single: bad piece ", piece.dump());
    if (leading++ == 0) first = (*st)["id"].get<std::string>();
  }
  if (leading == 0) return std::nullopt;
  if (leading > 1) RAISE(where, ".single: prepends ", leading, " tokens (only one BOS is supported)");
  const json* specials = key(*pp, "special_tokens");
  const json* entry = specials ? key(*specials, first.c_str()) : nullptr;
  const json* ids = entry ? key(*entry, "ids") : nullptr;
  if (!ids || !ids->is_array() || ids->size() != 1 || !(*ids)[0].is_number_integer())
    RAISE(where, ".special_tokens[\"", first, "\"].ids: expected one id");
  return static_cast<int32_t>((*ids)[0].get<int64_t>());
}

// A token given as "text" or {"content": "text", ...} (tokenizer_config.json, special_tokens_map.json).
std::optional<int32_t> named_token(const json& j, const char* k, const std::string& file, const Tokenizer::Impl& t) {
  const json* v = key(j, k);
  if (!v) return std::nullopt;
  const json* s = v->is_object() ? key(*v, "content") : v;
  if (!s || !s->is_string()) RAISE(file, ": ", k, ": expected a token string or {\"content\": ...}, got ", v->dump());
  auto id = t.token_to_id(s->get<std::string>());
  if (!id) RAISE(file, ": ", k, ": token \"", s->get<std::string>(), "\" is not in the vocabulary");
  return id;
}

std::vector<int32_t> id_list(const json& j, const char* k, const std::string& file) {
  const json* v = key(j, k);
  std::vector<int32_t> out;
  if (!v) return out;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      RAISE(file, ": ", k, ": expected a token id or a list of ids, got ", v->dump());
    out.push_back(static_cast<int32_t>(x.get<int64_t>()));
  };
  if (v->is_array()) {
    for (const json& x : *v) one(x);
  } else {
    one(*v);
  }
  return out;
}

void read_configs(const fs::path& dir, const json& top, Tokenizer::Impl& t) {
  std::vector<std::string> used;
  std::optional<bool> add_bos;
  std::vector<int32_t> gen_eos;
  auto take = [&](std::optional<int32_t>& slot, std::optional<int32_t> v) {
    if (!slot && v) slot = v;
  };
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    const fs::path p = dir / name;
    if (!fs::is_regular_file(p)) continue;
    const json j = read_json(p.string());
    if (!j.is_object()) RAISE(p.string(), ": expected a JSON object");
    used.push_back(name);
    if (std::string(name) == "generation_config.json") {
      auto b = id_list(j, "bos_token_id", p.string());
      gen_eos = id_list(j, "eos_token_id", p.string());
      if (b.size() > 1) RAISE(p.string(), ": bos_token_id: expected one id");
      take(t.bos, b.empty() ? std::nullopt : std::optional<int32_t>(b[0]));
      take(t.eos, gen_eos.empty() ? std::nullopt : std::optional<int32_t>(gen_eos[0]));
    } else {
      take(t.bos, named_token(j, "bos_token", p.string(), t));
      take(t.eos, named_token(j, "eos_token", p.string(), t));
      if (!add_bos && key(j, "add_bos_token")) add_bos = get_bool(j, "add_bos_token", false, p.string());
    }
  }
  const std::optional<int32_t> tmpl = template_bos(key(top, "post_processor"), t.path + ": post_processor");
  t.template_bos = tmpl;
  if (!t.bos && tmpl) {
    t.bos = tmpl;
    used.push_back("post_processor");
  }
  t.add_bos = add_bos ? *add_bos : tmpl.has_value();
  if (t.add_bos && !t.bos) RAISE(dir.string(), ": add_bos_token is true but no bos_token is given");
  if (t.eos) t.eos_ids.push_back(*t.eos);
  for (int32_t id : gen_eos)
    if (std::find(t.eos_ids.begin(), t.eos_ids.end(), id) == t.eos_ids.end()) t.eos_ids.push_back(id);
  for (int32_t id : t.eos_ids)
    if (id >= t.vocab_size) RAISE(dir.string(), ": eos id ", id, " is outside the vocabulary (", t.vocab_size, ")");
  if (t.bos && *t.bos >= t.vocab_size)
    RAISE(dir.string(), ": bos id ", *t.bos, " is outside the vocabulary (", t.vocab_size, ")");
  for (size_t i = 0; i < used.size(); ++i) t.config_source += (i ? ", " : "") + used[i];
  if (used.empty()) t.config_source = "nothing (no config files, no BOS template)";
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::is_regular_file(file)) {
    std::string hint;
    for (const char* other : {"tokenizer.model", "vocab.json", "tekken.json"})
      if (fs::exists(file.parent_path() / other)) hint += str_cat(" (the folder has ", other, ": only tokenizer.json is read)");
    RAISE(file.string(), ": no such tokenizer file", hint);
  }
  auto t = std::make_shared<Impl>();
  t->path = file.string();
  const json top = read_json(t->path);
  if (!top.is_object()) RAISE(t->path, ": expected a JSON object (a Hugging Face tokenizer.json)");
  check_keys(top, t->path + ":", {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                                  "post_processor", "decoder", "model"});
  // "truncation" and "padding" are not read: transformers resets both on every call from its own
  // arguments, and encode here, like a call without them, neither truncates nor pads.
  const json* model = key(top, "model");
  if (!model || !model->is_object()) RAISE(t->path, ": model: expected an object");
  const json* type = key(*model, "type");
  if (!type || !type->is_string()) RAISE(t->path, ": model.type: expected a string");
  if (type->get<std::string>() != "BPE")
    RAISE(t->path, ": model.type: \"", type->get<std::string>(), "\" is not supported (only BPE)");
  check_keys(*model, t->path + ": model", {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                           "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                           "vocab", "merges"});
  t->model.emplace(*model, t->path);
  t->normalizer = tok::read_normalizer(key(top, "normalizer"), t->path);
  t->pre_tokenizer = tok::read_pre_tokenizer(key(top, "pre_tokenizer"), t->path);
  t->decoder = tok::read_decoder(key(top, "decoder"), t->path);
  read_added_tokens(top, *t);
  t->vocab_size = t->model->max_id_plus_one();
  for (const AddedToken& a : t->added) t->vocab_size = std::max<int64_t>(t->vocab_size, a.id + 1);
  if (t->vocab_size == 0) RAISE(t->path, ": model.vocab: empty vocabulary");
  read_configs(file.parent_path(), top, *t);
  return Tokenizer(std::move(t));
}

}  // namespace engine
