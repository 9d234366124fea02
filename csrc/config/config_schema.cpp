// The config's key schema (config_fields.h): every field the visitor declares, looked up by
// section and key, and the "did you mean" suggestion for an unknown key (the nearest known key
// within two edits, case-insensitive). The parser (config.cpp) uses it to refuse unknown keys.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_fields.h"

namespace engine {

namespace config_detail {
namespace {

struct SchemaCollector {
  std::vector<FieldInfo> fields;
  std::string sec;
  void section(const char* s) { sec = s; }
  void add(const char* key, FieldKind kind, const char* note = "") {
    fields.push_back({sec, key, kind, note});
  }
  void field(const char* key, int&) { add(key, FieldKind::Int); }
  void field(const char* key, uint64_t&) { add(key, FieldKind::UInt64); }
  void field(const char* key, double&) { add(key, FieldKind::Double); }
  void field(const char* key, bool&) { add(key, FieldKind::Bool); }
  void field(const char* key, std::string&) { add(key, FieldKind::String); }
  template <typename E>
  void choice(const char* key, E&, std::span<const EnumName<E>>) {
    add(key, FieldKind::Choice);
  }
  void datasets(const char* key, std::vector<DatasetRef>&) { add(key, FieldKind::Datasets); }
  void derived(const char* key, int&, const char* formula) { add(key, FieldKind::Derived, formula); }
  void strings(const char* key, std::vector<std::string>&) { add(key, FieldKind::Strings); }
  void lr_scales(const char* key, std::vector<LrScale>&) { add(key, FieldKind::LrScales); }
  void numbers(const char* key, std::vector<double>&) { add(key, FieldKind::Numbers); }
};

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

const std::vector<FieldInfo>& schema() {
  static const std::vector<FieldInfo> fields = [] {
    Config c;
    SchemaCollector s;
    visit_fields(c, s);
    return s.fields;
  }();
  return fields;
}

const FieldInfo* find_field(const std::string& section, const std::string& key) {
  for (const auto& f : schema())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

bool is_section(const std::string& name) {
  for (const auto& f : schema())
    if (f.section == name) return true;
  return false;
}

std::string suggest_key(const std::string& section, const std::string& key) {
  constexpr size_t kMaxDistance = 2;
  const std::string k = lower(key);
  std::string best;
  size_t best_d = kMaxDistance + 1;
  auto consider = [&](const std::string& candidate, const std::string& shown, size_t penalty) {
    size_t d = edit_distance(k, candidate) + penalty;
    if (d < best_d) best_d = d, best = shown;
  };
  for (const auto& f : schema()) {
    if (section.empty()) {
      // A top-level name: a misspelt section, or a key written outside its section.
      consider(f.section, "[" + f.section + "]", 0);
      consider(f.key, f.section + "." + f.key, 0);
    } else if (f.section == section) {
      consider(f.key, section + "." + f.key, 0);
    } else if (f.key == k) {
      consider(f.key, f.section + "." + f.key, 1);  // the right key in the wrong section
    }
  }
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

}  // namespace config_detail

}  // namespace engine
