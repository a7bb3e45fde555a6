// Reads the keys of one YAML map into typed values, checking each key's name, type and range,
// and words every error the same way: "<origin>: <message><where>". <where> is
// " (from --set <text>)" for a key at or below an override's key path, else " (line N)" for a
// node below the top level that comes from the file, else " (from --set <text>)" for a key on
// the way to an override's key (a map it may have created), else nothing. Messages name the
// full key path ("train.batch_size").
//
// The section readers (config_reader.cpp) build on it; it knows no section.
//
// Internal to apps/config. Every error is a mixprec::Error.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "apps/config/config_overrides.h"
#include "apps/config/yaml_values.h"

namespace mixprec::config_loader {

// Where an unknown key might have been meant to go.
struct KeyHints {
  std::vector<std::pair<std::string, std::string>> synonyms;  // other spelling -> known key
  std::vector<std::string> elsewhere;  // keys that are valid for another type or kind
  std::string elsewhere_note;          // what to say about those: "a setting of type gpt"
};

class KeyReader {
 public:
  // `origin` starts every message; `overrides` are those applied to the tree being read.
  KeyReader(std::string origin, std::vector<Override> overrides);

  // --- Messages ----------------------------------------------------------------------------
  // `node` is where the problem is and `path` its key path; both only place the message.

  [[noreturn]] void fail(const YAML::Node& node, const std::string& path,
                         const std::string& message) const;
  // "<path>: expected <expected>, got <describe(node)>".
  [[noreturn]] void fail_type(const YAML::Node& node, const std::string& path,
                              const std::string& expected) const;
  // "<path> <requirement>, got <the value as written>".
  [[noreturn]] void fail_range(const YAML::Node& node, const std::string& path,
                               const std::string& requirement) const;

  // --- Maps --------------------------------------------------------------------------------

  // `key` is there and not null.
  static bool present(const YAML::Node& map, const std::string& key);

  // The map under `key`, or an empty map when the key is absent or null (a section whose
  // settings are all commented out); anything else under it is a type error.
  YAML::Node section(const YAML::Node& parent, const std::string& parent_path,
                     const std::string& key) const;

  // Every key of `map` must be a scalar, one of `allowed`, and appear once. An unknown key's
  // message says, in this order of preference: that it belongs elsewhere (hints.elsewhere),
  // the closest known key or synonym, or the list of allowed keys.
  void check_keys(const YAML::Node& map, const std::string& path,
                  const std::vector<std::string>& allowed, const KeyHints& hints = {}) const;

  // --- Scalars -----------------------------------------------------------------------------
  // Unquoted scalars only for numbers and booleans: "128" in quotes is a string.

  int64_t to_int(const YAML::Node& node, const std::string& path) const;
  // A negative value is a range error ("must be >= 0"), not a type error.
  uint64_t to_uint(const YAML::Node& node, const std::string& path) const;
  double to_double(const YAML::Node& node, const std::string& path) const;
  // true, True, TRUE, false, False or FALSE; nothing else (no yes, no 1).
  bool to_bool(const YAML::Node& node, const std::string& path) const;
  std::string to_string(const YAML::Node& node, const std::string& path) const;
  // One of `choices`, with "did you mean" for a near miss.
  std::string to_choice(const YAML::Node& node, const std::string& path,
                        const std::vector<std::string>& choices) const;

  void check_int(const YAML::Node& node, const std::string& path, int64_t value,
                 const IntRange& range) const;
  void check_double(const YAML::Node& node, const std::string& path, double value,
                    const DoubleRange& range) const;

  // Keyed reads: each leaves `out` as it is when `key` is absent and says whether it read.
  bool read_int(const YAML::Node& map, const std::string& map_path, const std::string& key,
                int64_t& out, const IntRange& range = {}) const;
  bool read_double(const YAML::Node& map, const std::string& map_path, const std::string& key,
                   double& out, const DoubleRange& range) const;
  bool read_bool(const YAML::Node& map, const std::string& map_path, const std::string& key,
                 bool& out) const;
  bool read_string(const YAML::Node& map, const std::string& map_path, const std::string& key,
                   std::string& out) const;
  bool read_choice(const YAML::Node& map, const std::string& map_path, const std::string& key,
                   std::string& out, const std::vector<std::string>& choices) const;

 private:
  std::string where(const YAML::Node& node, const std::string& path) const;

  std::string origin_;
  std::vector<Override> overrides_;
};

}  // namespace mixprec::config_loader
