#include "apps/config/yaml_values.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <regex>
#include <system_error>

namespace mixprec::config_loader {
namespace {

template <class T>
IntParse parse_integer_as(std::string_view text, T& out) {
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  const size_t digits_from = (!text.empty() && text[0] == '-') ? 1 : 0;
  if (text.size() == digits_from) return IntParse::NotInteger;
  for (size_t i = digits_from; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return IntParse::NotInteger;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), out);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size())
    return IntParse::OutOfRange;
  return IntParse::Ok;
}

}  // namespace

std::string join_key(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string item_path(const std::string& parent, size_t index) {
  return parent + "[" + std::to_string(index) + "]";
}

std::string join_list(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool is_quoted(const YAML::Node& node) {
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      return is_quoted(node) ? "the quoted string '" + node.Scalar() + "'"
                             : "'" + node.Scalar() + "'";
    default:
      return "nothing";
  }
}

// The '.' in every mantissa lets the file show which settings are real numbers, and makes
// YAML 1.1 readers (PyYAML) also read 1.0e-08 as a float rather than the string "1e-08".
std::string format_number(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, result.ptr);
  const size_t exponent = std::min(text.find('e'), text.size());
  if (text.find('.') == std::string::npos) text.insert(exponent, ".0");
  return text;
}

IntParse parse_integer(std::string_view text, int64_t& out) { return parse_integer_as(text, out); }

IntParse parse_integer(std::string_view text, uint64_t& out) {
  return parse_integer_as(text, out);
}

std::optional<double> parse_double(const std::string& text) {
  static const std::regex kSpecial(R"(([-+]?)\.(inf|Inf|INF)|\.(nan|NaN|NAN))");
  static const std::regex kNumber(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  std::smatch match;
  if (std::regex_match(text, match, kSpecial)) {
    if (match[3].matched) return std::numeric_limits<double>::quiet_NaN();
    return match[1].str() == "-" ? -std::numeric_limits<double>::infinity()
                                 : std::numeric_limits<double>::infinity();
  }
  if (!std::regex_match(text, kNumber)) return std::nullopt;
  std::string_view digits(text);
  if (digits[0] == '+') digits.remove_prefix(1);
  double value = 0.0;
  const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  // A literal beyond the double range (1e999) would otherwise read as inf.
  if (result.ec != std::errc()) return std::nullopt;
  return value;
}

bool DoubleRange::allows(double value) const {
  if (!std::isfinite(value)) return false;
  if (min && (min_open ? value <= *min : value < *min)) return false;
  if (max && (max_open ? value >= *max : value > *max)) return false;
  return true;
}

std::string DoubleRange::requirement() const {
  std::string text = "must be finite";
  // Bounds read as in the docs: "> 0", not "> 0.0".
  auto bound = [](double v) {
    std::string s = format_number(v);
    return s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0 ? s.substr(0, s.size() - 2) : s;
  };
  if (min) text = std::string("must be ") + (min_open ? "> " : ">= ") + bound(*min);
  if (max)
    text += std::string(min ? " and " : "must be ") + (max_open ? "< " : "<= ") + bound(*max);
  return text;
}

}  // namespace mixprec::config_loader
