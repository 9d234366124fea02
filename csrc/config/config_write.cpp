// Config -> TOML: every key in visit_fields order, defaults and presets written out, derived keys
// as comments (setting them is an error), floats in shortest round-trip form, so that
// parse_config(config_to_toml(c)) == c.
#include <charconv>
#include <cstdio>
#include <string>

#include "config/config.h"
#include "config/config_fields.h"
#include "core/check.h"

namespace engine {
namespace {

using namespace config_detail;

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back to the same double, always a TOML float ("1.0", not "1").
std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (size_t e = s.find('e'); e != std::string::npos) {
    // "1e-05" -> "1e-5": drop the exponent's '+' and leading zeros (both valid TOML either way).
    size_t digits = e + 1 + (s[e + 1] == '-' || s[e + 1] == '+');
    size_t nz = s.find_first_not_of('0', digits);
    s = s.substr(0, e + 1) + (s[e + 1] == '-' ? "-" : "") + s.substr(nz);
  } else if (s.find_first_of(".ni") == std::string::npos) {
    s += ".0";  // a float, not an integer; "inf"/"nan" never pass validation
  }
  return s;
}

struct Writer {
  std::string out;

  void line(const char* key, const std::string& value) {
    out += key;
    out += " = ";
    out += value;
    out += '\n';
  }
  void section(const char* s) {
    if (!out.empty()) out += '\n';
    out += "[";
    out += s;
    out += "]\n";
  }
  void field(const char* key, const int& v) { line(key, std::to_string(v)); }
  void field(const char* key, const uint64_t& v) { line(key, std::to_string(v)); }
  void field(const char* key, const double& v) { line(key, format_double(v)); }
  void field(const char* key, const bool& v) { line(key, v ? "true" : "false"); }
  void field(const char* key, const std::string& v) { line(key, quote(v)); }
  template <typename E>
  void choice(const char* key, const E& v, std::span<const EnumName<E>> names) {
    line(key, quote(enum_name(v, names)));
  }
  void datasets(const char* key, const std::vector<DatasetRef>& v) {
    if (v.empty()) return line(key, "[]");
    std::string s = "[\n";
    for (const auto& d : v)
      s += "  { path = " + quote(d.path) + ", weight = " + format_double(d.weight) + " },\n";
    line(key, s + "]");
  }
  void strings(const char* key, const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + quote(v[i]);
    line(key, s + "]");
  }
  void lr_scales(const char* key, const std::vector<LrScale>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i)
      s += std::string(i ? ", " : "") + "{ pattern = " + quote(v[i].pattern) + ", scale = " + format_double(v[i].scale) + " }";
    line(key, s + "]");
  }
  void numbers(const char* key, const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_double(v[i]);
    line(key, s + "]");
  }
  void derived(const char* key, const int& v, const char* formula) {
    out += str_cat("# ", key, " = ", v, "  (derived: ", formula, ")\n");
  }
};

}  // namespace

std::string config_to_toml(const Config& c) {
  Writer w;
  w.out = "# Effective config: defaults, presets and derived values filled in.\n";
  if (!c.source.empty() && c.source.find('\n') == std::string::npos)
    w.out += "# From " + c.source + ".\n";
  visit_fields(c, w);
  return w.out;
}

}  // namespace engine
