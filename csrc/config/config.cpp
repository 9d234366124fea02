// TOML text -> Config: syntax (toml++), structure (known sections and keys, origins), command-line
// overrides, typed reads; then finish_config (config_validate.cpp) fills presets and defaults and
// checks the values. The only translation unit that includes toml++ (it is slow to compile).
//
// Type rules: int fields take TOML integers, or floats with an integral value, within the int
// range; float fields take floats or integers, finite; bool and string fields take only their
// type; enums are lowercase strings. Errors read "file:line: section.key: what", with
// "<command line>" in place of file:line for overrides.
#include <toml++/toml.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "config/config.h"
#include "config/config_fields.h"
#include "core/check.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using namespace config_detail;

constexpr const char* kCommandLine = "<command line>";

// "string \"abc\"", "integer 5", ... for type errors.
std::string describe(const toml::node& n) {
  if (auto* s = n.as_string()) return "string \"" + s->get() + "\"";
  if (auto* i = n.as_integer()) return str_cat("integer ", i->get());
  if (auto* f = n.as_floating_point()) return str_cat("float ", f->get());
  if (auto* b = n.as_boolean()) return b->get() ? "boolean true" : "boolean false";
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  return "a date/time";
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

class Parser {
 public:
  Parser(Config& c, const toml::table& root, fs::path base_dir)
      : c_(c), root_(root), base_dir_(std::move(base_dir)) {}

  // Every top-level entry must be a known section holding known keys; records their origins.
  void check_structure() {
    for (auto&& [k, node] : root_) {
      const std::string name(k.str());
      const std::string loc = location(k.source(), node.source());
      if (!is_section(name)) RAISE(loc, ": ", name, ": unknown key", suggest_key("", name));
      if (!node.is_table())
        RAISE(loc, ": ", name, ": expected a table [", name, "], got ", describe(node));
      c_.origin[name] = loc;
      for (auto&& [k2, value] : *node.as_table()) {
        const std::string key(k2.str());
        const std::string path = name + "." + key;
        const std::string loc2 = location(k2.source(), value.source());
        const FieldInfo* f = find_field(name, key);
        if (!f) RAISE(loc2, ": ", path, ": unknown key", suggest_key(name, key));
        if (f->kind == FieldKind::Derived)
          RAISE(loc2, ": ", path, ": derived (", f->note, "), do not set");
        c_.origin[path] = loc2;
      }
    }
  }

  // "section.key=value": value as a TOML value, else as a bare string.
  void apply_override(const std::string& text) {
    const size_t eq = text.find('=');
    if (eq == std::string::npos)
      RAISE(kCommandLine, ": malformed override '", text, "': expected section.key=value");
    const std::string path = trim(text.substr(0, eq));
    const std::string value = trim(text.substr(eq + 1));
    if (path.empty())
      RAISE(kCommandLine, ": malformed override '", text,
            "': empty key, expected section.key=value");
    const size_t dot = path.find('.');
    const std::string section = path.substr(0, dot);
    const std::string key = dot == std::string::npos ? "" : path.substr(dot + 1);
    if (section.empty() || (dot != std::string::npos && key.empty()))
      RAISE(kCommandLine, ": malformed override '", text, "': expected section.key=value");
    const FieldInfo* f = key.empty() ? nullptr : find_field(section, key);
    if (!f) {
      std::string hint = !is_section(section) ? suggest_key("", section)
                         : key.find('.') == std::string::npos ? suggest_key(section, key)
                                                              : "";
      RAISE(kCommandLine, ": ", path, ": unknown key in override '", text, "'", hint);
    }
    if (f->kind == FieldKind::Derived)
      RAISE(kCommandLine, ": ", path, ": derived (", f->note, "), do not set (override '", text,
            "')");

    toml::table t;
    bool parsed = false;
    try {
      t = toml::parse("v = " + value, std::string_view(kCommandLine));
      parsed = t.size() == 1 && t.contains("v");
    } catch (const toml::parse_error&) {
      parsed = false;
    }
    // A string key takes the text as written even when it parses as another type (name=123).
    if (parsed && f->kind == FieldKind::String && !t.get("v")->is_string()) parsed = false;
    if (!parsed) {
      t = toml::table{};
      t.insert("v", value);
    }
    overrides_[path] = std::move(t);
    c_.origin[path] = kCommandLine;
  }

  // Visitor interface of visit_fields: typed reads of the keys that were set.
  void section(const char* s) { sec_ = s; }

  void field(const char* key, int& out) {
    std::string path;
    if (const toml::node* n = find(key, path))
      out = static_cast<int>(integer(*n, path, INT_MIN, INT_MAX, "a 32-bit int"));
  }
  void field(const char* key, uint64_t& out) {
    std::string path;
    if (const toml::node* n = find(key, path))
      out = static_cast<uint64_t>(integer(*n, path, 0, INT64_MAX, "[0, 2^63)"));
  }
  void field(const char* key, double& out) {
    std::string path;
    if (const toml::node* n = find(key, path)) out = number(*n, c_.where(path));
  }
  void field(const char* key, bool& out) {
    std::string path;
    const toml::node* n = find(key, path);
    if (!n) return;
    const auto* b = n->as_boolean();
    if (!b) RAISE(c_.where(path), "expected a boolean (true or false), got ", describe(*n));
    out = b->get();
  }
  void field(const char* key, std::string& out) {
    std::string path;
    const toml::node* n = find(key, path);
    if (!n) return;
    const auto* s = n->as_string();
    if (!s) RAISE(c_.where(path), "expected a string, got ", describe(*n));
    out = s->get();
  }
  template <typename E>
  void choice(const char* key, E& out, std::span<const EnumName<E>> names) {
    std::string path;
    const toml::node* n = find(key, path);
    if (!n) return;
    const auto* s = n->as_string();
    if (!s)
      RAISE(c_.where(path), "expected a string (", enum_choices(names), "), got ", describe(*n));
    for (const auto& e : names) {
      if (s->get() == e.name) {
        out = e.value;
        return;
      }
    }
    RAISE(c_.where(path), "unknown value \"", s->get(), "\", expected ", enum_choices(names));
  }
  void derived(const char*, int&, const char*) {}  // setting one is an error (check_structure)

  // A list of { path = "...", weight = w } (weight optional) or plain path strings; a single
  // entry outside a list is taken as a list of one.
  void datasets(const char* key, std::vector<DatasetRef>& out) {
    std::string path;
    const toml::node* n = find(key, path);
    if (!n) return;
    const bool from_cli = c_.origin[path] == kCommandLine;
    std::vector<const toml::node*> entries;
    if (const auto* arr = n->as_array()) {
      for (const auto& e : *arr) entries.push_back(&e);
    } else {
      entries.push_back(n);
    }
    out.clear();
    for (size_t i = 0; i < entries.size(); ++i) {
      const toml::node& e = *entries[i];
      DatasetRef ref;
      ref.line = from_cli ? 0 : static_cast<int>(e.source().begin.line);
      const std::string at = str_cat(from_cli || ref.line == 0 ? c_.origin[path]
                                                                : str_cat(c_.source, ":", ref.line),
                                     ": ", path, "[", i, "]");
      if (const auto* s = e.as_string()) {
        ref.path = s->get();
      } else if (const auto* t = e.as_table()) {
        bool has_path = false;
        for (auto&& [k, v] : *t) {
          const std::string name(k.str());
          if (name == "path") {
            const auto* ps = v.as_string();
            if (!ps) RAISE(at, ".path: expected a string, got ", describe(v));
            ref.path = ps->get();
            has_path = true;
          } else if (name == "weight") {
            ref.weight = number(v, at + ".weight: ");
          } else {
            RAISE(at, ".", name, ": unknown key (a dataset has path and weight)");
          }
        }
        if (!has_path) RAISE(at, ": missing path");
      } else {
        RAISE(at, ": expected a path string or { path = \"...\", weight = w }, got ", describe(e));
      }
      if (ref.path.empty()) RAISE(at, ".path: must not be empty");
      if (!(ref.weight > 0)) RAISE(at, ".weight: must be > 0, got ", ref.weight);
      // Paths in the file are relative to the file; paths on the command line to the cwd.
      if (!from_cli && !base_dir_.empty() && fs::path(ref.path).is_relative())
        ref.path = (base_dir_ / ref.path).lexically_normal().string();
      out.push_back(std::move(ref));
    }
  }

 private:
  std::string location(const toml::source_region& key, const toml::source_region& value) const {
    auto line = key.begin.line ? key.begin.line : value.begin.line;
    return line ? str_cat(c_.source, ":", line) : c_.source;
  }

  const toml::node* find(const char* key, std::string& path) const {
    path = sec_ + "." + key;
    if (auto it = overrides_.find(path); it != overrides_.end()) return it->second.get("v");
    const toml::node* s = root_.get(sec_);
    return s ? s->as_table()->get(key) : nullptr;
  }

  int64_t integer(const toml::node& n, const std::string& path, int64_t lo, int64_t hi,
                  const char* range) const {
    if (const auto* i = n.as_integer()) {
      const int64_t v = i->get();
      if (v < lo || v > hi) RAISE(c_.where(path), "out of range: ", v, " is outside ", range);
      return v;
    }
    if (const auto* f = n.as_floating_point()) {
      const double d = f->get();
      if (!std::isfinite(d) || d != std::trunc(d))
        RAISE(c_.where(path), "expected an integer, got float ", d);
      // (double)hi + 1 is exact for 2^31 and rounds to 2^63 for INT64_MAX: both bounds hold.
      if (d < static_cast<double>(lo) || d >= static_cast<double>(hi) + 1.0)
        RAISE(c_.where(path), "out of range: ", d, " is outside ", range);
      return static_cast<int64_t>(d);
    }
    RAISE(c_.where(path), "expected an integer, got ", describe(n));
  }

  // `at` is the "where" prefix, ending in ": ".
  static double number(const toml::node& n, const std::string& at) {
    double d = 0;
    if (const auto* i = n.as_integer()) {
      d = static_cast<double>(i->get());
    } else if (const auto* f = n.as_floating_point()) {
      d = f->get();
    } else {
      RAISE(at, "expected a number, got ", describe(n));
    }
    if (!std::isfinite(d)) RAISE(at, "must be finite, got ", d);
    return d;
  }

  Config& c_;
  const toml::table& root_;
  fs::path base_dir_;
  std::string sec_;
  std::map<std::string, toml::table> overrides_;  // "section.key" -> { v = value }
};

Config parse_impl(const std::string& text, const std::string& source, const fs::path& base_dir,
                  const std::vector<std::string>& overrides) {
  Config c;
  c.source = source;
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    RAISE(source, ":", e.source().begin.line, ":", e.source().begin.column,
          ": TOML syntax error: ", e.description());
  }
  Parser p(c, root, base_dir);
  p.check_structure();
  for (const auto& o : overrides) p.apply_override(o);
  visit_fields(c, p);
  finish_config(c);
  return c;
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  fs::path dir = fs::path(source_name).parent_path();
  if (!dir.empty()) dir = fs::absolute(dir);
  return parse_impl(toml_text, source_name, dir, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!fs::exists(path, ec)) RAISE(path, ": config file not found");
  if (fs::is_directory(path, ec)) RAISE(path, ": is a directory, not a config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) RAISE(path, ": cannot open config file: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) RAISE(path, ": cannot read config file: ", std::strerror(errno));
  return parse_impl(text.str(), path, fs::absolute(path).parent_path(), overrides);
}

}  // namespace engine
