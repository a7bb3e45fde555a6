// The vocabulary the config loader shares: strict parsing of YAML scalars, how a node and a
// number are written in messages and files, key paths, and the allowed ranges of settings.
//
// yaml-cpp's as<T>() accepts too much for a config that decides hours of training ("1" and
// "yes" as bool, "12.5" truncated to an int, a quoted "128" as a number), so scalars are
// parsed here by hand with the YAML 1.2 core-schema spellings and nothing else.
//
// Internal to apps/config.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mixprec::config_loader {

// --- Key paths ---------------------------------------------------------------------------

// "train" + "steps" -> "train.steps"; an empty parent gives the key alone.
std::string join_key(const std::string& parent, const std::string& key);
// "model.layers" + 2 -> "model.layers[2]".
std::string item_path(const std::string& parent, size_t index);
// "a, b, c", for "the keys of train are ...".
std::string join_list(const std::vector<std::string>& names);
bool contains(const std::vector<std::string>& names, const std::string& name);

// --- Nodes in messages -------------------------------------------------------------------

// A quoted scalar ("128", '1') or one tagged !!str is a string whatever it spells.
bool is_quoted(const YAML::Node& node);

// What a node is, for "expected X, got Y": "null", "a list", "a map", "'abc'" or "the quoted
// string '128'".
std::string describe(const YAML::Node& node);

// The shortest text that reads back to the same double, spelled as a YAML float: the mantissa
// always has a '.' ("1.0", "1.0e-08"); .nan, .inf and -.inf for the special values.
std::string format_number(double value);

// --- Scalars -----------------------------------------------------------------------------

// Integers: decimal digits with an optional sign, nothing else (no 1e3, no 12.0). OutOfRange:
// the digits are fine but the value does not fit `out` (a '-' counts as such for uint64_t).
// `out` is written only on Ok.
enum class IntParse { Ok, NotInteger, OutOfRange };
IntParse parse_integer(std::string_view text, int64_t& out);
IntParse parse_integer(std::string_view text, uint64_t& out);

// The YAML 1.2 core schema's numbers: integers, decimals, exponents, .inf and .nan (with their
// capitalised spellings). Nothing for any other text, and for a literal beyond the double
// range (1e999).
std::optional<double> parse_double(const std::string& text);

// --- Ranges ------------------------------------------------------------------------------

// The allowed values of an integer setting (bounds inclusive).
struct IntRange {
  std::optional<int64_t> min;
  std::optional<int64_t> max;
  static IntRange at_least(int64_t min) { return IntRange{min, std::nullopt}; }
  static IntRange between(int64_t min, int64_t max) { return IntRange{min, max}; }
};

// The allowed values of a real setting; every one must also be finite.
struct DoubleRange {
  std::optional<double> min, max;
  bool min_open = false, max_open = false;
  static DoubleRange finite() { return {}; }
  static DoubleRange at_least(double min) { return {min, std::nullopt, false, false}; }
  static DoubleRange above(double min) { return {min, std::nullopt, true, false}; }
  static DoubleRange between(double min, bool min_open, double max, bool max_open) {
    return {min, max, min_open, max_open};
  }
  bool allows(double value) const;
  // The rule in words, for "<key> <requirement>, got <value>": "must be finite", "must be > 0",
  // "must be >= 0 and < 1".
  std::string requirement() const;
};

}  // namespace mixprec::config_loader
