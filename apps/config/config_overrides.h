// The CLI's `--set key.path=value`: parsed, then written into the YAML tree before the tree is
// validated, so that a value set on the command line meets the same checks as one from the
// file.
//
// Internal to apps/config. Errors are mixprec::Error, "<origin>: --set '<text>': <why>", for a
// text without '=', an empty key or key part, a part that is not `key` or `key[index]`, a
// value that is not YAML, a step through something that is not a map or list, or an index
// past the end of a list.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string>
#include <vector>

namespace mixprec::config_loader {

// One part of a key path: "layers[0]" -> {layers, {0}}.
struct OverrideStep {
  std::string key;
  std::vector<size_t> indices;
};

// One "--set key.path=value", split: model.layers[0].conv=64 -> (model, {}), (layers, {0}),
// (conv, {}).
struct Override {
  std::string text;  // as given
  std::string key_path;
  std::string value;
  std::vector<OverrideStep> steps;
};

// Parses each of `texts` and applies it to `root` (a map), in order, so that a later one wins.
// Maps on the way to a key are created; list items must exist. The value is parsed as YAML:
// "[0.9, 0.95]" is a list and "100" a number.
//
// The run length is one setting given two ways: an override of train.steps removes the
// file's train.epochs, and one of train.epochs removes train.steps (unless both are set).
//
// Returns the parsed overrides, for messages that name the --set a bad value came from.
std::vector<Override> apply_overrides(const std::string& origin, YAML::Node& root,
                                      const std::vector<std::string>& texts);

}  // namespace mixprec::config_loader
