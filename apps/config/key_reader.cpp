#include "apps/config/key_reader.h"

#include <cmath>
#include <optional>

#include "apps/config/suggest.h"
#include "core/error.h"

namespace mixprec::config_loader {
namespace {

// `path` is `prefix` or lies below it ("train.steps" within "train", "model.layers[0]" within
// "model.layers").
bool within(const std::string& path, const std::string& prefix) {
  if (path.size() < prefix.size() || path.compare(0, prefix.size(), prefix) != 0) return false;
  if (path.size() == prefix.size() || prefix.empty()) return true;
  return path[prefix.size()] == '.' || path[prefix.size()] == '[';
}

// The text a value was written as, for "got ..." in range errors.
std::string raw(const YAML::Node& node) { return node.IsScalar() ? node.Scalar() : describe(node); }

// Calls read(node, path) with `key` of `map` and its path when the key is there; says whether
// it was.
template <class Read>
bool read_key(const YAML::Node& map, const std::string& map_path, const std::string& key,
              const Read& read) {
  const YAML::Node node = map[key];
  if (!node.IsDefined()) return false;
  read(node, join_key(map_path, key));
  return true;
}

}  // namespace

KeyReader::KeyReader(std::string origin, std::vector<Override> overrides)
    : origin_(std::move(origin)), overrides_(std::move(overrides)) {}

// --- Messages ------------------------------------------------------------------------------

void KeyReader::fail(const YAML::Node& node, const std::string& path,
                     const std::string& message) const {
  throw Error(origin_ + ": " + message + where(node, path));
}

// " (from --set ...)" for a value an override wrote, " (line N)" for one from the file.
std::string KeyReader::where(const YAML::Node& node, const std::string& path) const {
  for (const Override& override_ : overrides_)
    if (within(path, override_.key_path)) return " (from --set " + override_.text + ")";
  // The top level's line says nothing: a missing section has no line of its own.
  if (!path.empty() && node.IsDefined() && !node.Mark().is_null())
    return " (line " + std::to_string(node.Mark().line + 1) + ")";
  // A map that an override created on its way to its key has no place in the file.
  for (const Override& override_ : overrides_)
    if (within(override_.key_path, path)) return " (from --set " + override_.text + ")";
  return "";
}

void KeyReader::fail_type(const YAML::Node& node, const std::string& path,
                          const std::string& expected) const {
  fail(node, path, path + ": expected " + expected + ", got " + describe(node));
}

void KeyReader::fail_range(const YAML::Node& node, const std::string& path,
                           const std::string& requirement) const {
  fail(node, path, path + " " + requirement + ", got " + raw(node));
}

// --- Maps ----------------------------------------------------------------------------------

bool KeyReader::present(const YAML::Node& map, const std::string& key) {
  const YAML::Node child = map[key];
  return child.IsDefined() && !child.IsNull();
}

YAML::Node KeyReader::section(const YAML::Node& parent, const std::string& parent_path,
                              const std::string& key) const {
  const YAML::Node child = parent[key];
  if (!child.IsDefined() || child.IsNull()) return YAML::Node(YAML::NodeType::Map);
  const std::string path = join_key(parent_path, key);
  if (!child.IsMap()) fail_type(child, path, "a map");
  return child;
}

void KeyReader::check_keys(const YAML::Node& map, const std::string& path,
                           const std::vector<std::string>& allowed, const KeyHints& hints) const {
  std::vector<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    // A copy (a handle): `it->first` lives in a temporary that ends with this statement.
    const YAML::Node key_node = it->first;
    if (!key_node.IsScalar())
      fail(key_node, path,
           (path.empty() ? "a top-level key" : "a key of " + path) + " is " + describe(key_node) +
               "; keys must be plain names");
    const std::string key = key_node.Scalar();
    const std::string key_path = join_key(path, key);
    if (contains(seen, key)) fail(key_node, key_path, "duplicate key '" + key_path + "'");
    seen.push_back(key);
    if (contains(allowed, key)) continue;

    std::string message = "unknown key '" + key_path + "'";
    std::vector<std::pair<std::string, std::string>> spellings;
    for (const std::string& name : allowed) spellings.emplace_back(name, name);
    spellings.insert(spellings.end(), hints.synonyms.begin(), hints.synonyms.end());
    if (contains(hints.elsewhere, key)) {
      message += " (it is " + hints.elsewhere_note + ")";
    } else if (const auto suggestion = closest_match(key, spellings)) {
      message += " (did you mean '" + *suggestion + "'?)";
    } else {
      message += path.empty() ? "; the top-level keys are " + join_list(allowed)
                              : "; the keys of " + path + " are " + join_list(allowed);
    }
    fail(key_node, key_path, message);
  }
}

// --- Scalars -------------------------------------------------------------------------------

int64_t KeyReader::to_int(const YAML::Node& node, const std::string& path) const {
  int64_t value = 0;
  if (!node.IsScalar() || is_quoted(node)) fail_type(node, path, "an integer");
  const IntParse parsed = parse_integer(node.Scalar(), value);
  if (parsed == IntParse::NotInteger) fail_type(node, path, "an integer");
  if (parsed == IntParse::OutOfRange)
    fail(node, path, path + ": " + node.Scalar() + " does not fit a 64-bit integer");
  return value;
}

uint64_t KeyReader::to_uint(const YAML::Node& node, const std::string& path) const {
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  if (!node.IsScalar() || is_quoted(node)) fail_type(node, path, "an integer");
  if (!text.empty() && text[0] == '-') {
    int64_t negative = 0;
    if (parse_integer(text, negative) == IntParse::NotInteger) fail_type(node, path, "an integer");
    fail_range(node, path, "must be >= 0");
  }
  uint64_t value = 0;
  const IntParse parsed = parse_integer(text, value);
  if (parsed == IntParse::NotInteger) fail_type(node, path, "an integer");
  if (parsed == IntParse::OutOfRange)
    fail(node, path, path + ": " + text + " does not fit an unsigned 64-bit integer");
  return value;
}

double KeyReader::to_double(const YAML::Node& node, const std::string& path) const {
  if (!node.IsScalar() || is_quoted(node)) fail_type(node, path, "a number");
  const std::optional<double> value = parse_double(node.Scalar());
  if (!value) fail_type(node, path, "a number");
  return *value;
}

bool KeyReader::to_bool(const YAML::Node& node, const std::string& path) const {
  if (node.IsScalar() && !is_quoted(node)) {
    const std::string& text = node.Scalar();
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
  }
  fail_type(node, path, "true or false");
}

std::string KeyReader::to_string(const YAML::Node& node, const std::string& path) const {
  if (!node.IsScalar()) fail_type(node, path, "a string");
  return node.Scalar();
}

std::string KeyReader::to_choice(const YAML::Node& node, const std::string& path,
                                 const std::vector<std::string>& choices) const {
  if (!node.IsScalar()) fail_type(node, path, "one of " + join_list(choices));
  const std::string value = node.Scalar();
  if (contains(choices, value)) return value;
  std::string message = path + " must be one of " + join_list(choices) + ", got '" + value + "'";
  if (const auto suggestion = closest_match(value, choices))
    message += " (did you mean '" + *suggestion + "'?)";
  fail(node, path, message);
}

void KeyReader::check_int(const YAML::Node& node, const std::string& path, int64_t value,
                          const IntRange& range) const {
  if (range.min && value < *range.min)
    fail_range(node, path, "must be >= " + std::to_string(*range.min));
  if (range.max && value > *range.max)
    fail_range(node, path, "must be <= " + std::to_string(*range.max));
}

void KeyReader::check_double(const YAML::Node& node, const std::string& path, double value,
                             const DoubleRange& range) const {
  if (range.allows(value)) return;
  if (!std::isfinite(value)) fail_range(node, path, "must be finite");
  fail_range(node, path, range.requirement());
}

bool KeyReader::read_int(const YAML::Node& map, const std::string& map_path,
                         const std::string& key, int64_t& out, const IntRange& range) const {
  return read_key(map, map_path, key, [&](const YAML::Node& node, const std::string& path) {
    out = to_int(node, path);
    check_int(node, path, out, range);
  });
}

bool KeyReader::read_double(const YAML::Node& map, const std::string& map_path,
                            const std::string& key, double& out, const DoubleRange& range) const {
  return read_key(map, map_path, key, [&](const YAML::Node& node, const std::string& path) {
    out = to_double(node, path);
    check_double(node, path, out, range);
  });
}

bool KeyReader::read_bool(const YAML::Node& map, const std::string& map_path,
                          const std::string& key, bool& out) const {
  return read_key(map, map_path, key, [&](const YAML::Node& node, const std::string& path) {
    out = to_bool(node, path);
  });
}

bool KeyReader::read_string(const YAML::Node& map, const std::string& map_path,
                            const std::string& key, std::string& out) const {
  return read_key(map, map_path, key, [&](const YAML::Node& node, const std::string& path) {
    out = to_string(node, path);
  });
}

bool KeyReader::read_choice(const YAML::Node& map, const std::string& map_path,
                            const std::string& key, std::string& out,
                            const std::vector<std::string>& choices) const {
  return read_key(map, map_path, key, [&](const YAML::Node& node, const std::string& path) {
    out = to_choice(node, path, choices);
  });
}

}  // namespace mixprec::config_loader
