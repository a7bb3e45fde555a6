// The config's schema: which keys each section has, their types, ranges and defaults, and the
// checks across keys (n_embd divisible by n_head, exactly one of epochs and steps, a dynamic
// loss scale's init_scale within [min_scale, max_scale], ...). Data paths are resolved to
// existing files here.
//
// Internal to apps/config. Errors are mixprec::Error in the words of key_reader.h; yaml-cpp's
// own exceptions pass through.
#pragma once

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>
#include <vector>

#include "apps/config/config_overrides.h"
#include "apps/config/train_config.h"

namespace mixprec::config_loader {

// The TrainConfig that `root` (a map, `overrides` already applied to it) describes. `origin`
// starts every message; relative data paths resolve against `base_dir` (absolute) first and
// then the working directory; `default_name` is the name when the file gives none.
// source_path is left empty.
TrainConfig read_train_config(const YAML::Node& root, const std::string& origin,
                              const std::filesystem::path& base_dir,
                              std::vector<Override> overrides, const std::string& default_name);

}  // namespace mixprec::config_loader
