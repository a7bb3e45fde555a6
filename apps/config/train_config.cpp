// The YAML loader: parse, apply --set overrides to the tree (config_overrides.h), then walk the
// tree once, section by section (config_reader.h), checking every key, type and range before a
// value lands in TrainConfig. to_yaml lives in config_writer.cpp.
#include "apps/config/train_config.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "apps/config/config_overrides.h"
#include "apps/config/config_reader.h"
#include "apps/config/yaml_values.h"
#include "core/error.h"

namespace mixprec {

namespace fs = std::filesystem;

TrainConfig parse_train_config(const std::string& yaml_text, const std::string& origin,
                               const std::string& base_dir,
                               const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root.reset(YAML::Load(yaml_text));
  } catch (const YAML::ParserException& error) {
    // yaml-cpp counts lines and columns from 0; editors count from 1.
    MIXPREC_FAIL(origin, ":", error.mark.line + 1, ":", error.mark.column + 1, ": ", error.msg);
  } catch (const YAML::Exception& error) {
    MIXPREC_FAIL(origin, ": ", error.what());
  }
  if (!root.IsDefined() || root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
  if (!root.IsMap())
    MIXPREC_FAIL(origin, ": expected a map of sections (model:, data:, ...) at the top level, got ",
                 config_loader::describe(root));

  std::vector<config_loader::Override> parsed =
      config_loader::apply_overrides(origin, root, overrides);

  fs::path base = base_dir.empty() ? fs::current_path() : fs::absolute(base_dir);
  std::string default_name = fs::path(origin).stem().string();
  if (default_name.empty()) default_name = "config";
  TrainConfig config;
  try {
    config = config_loader::read_train_config(root, origin, base.lexically_normal(),
                                              std::move(parsed), default_name);
  } catch (const YAML::Exception& error) {
    MIXPREC_FAIL(origin, ": ", error.what());
  }
  config.source_path = origin;
  return config;
}

std::string effective_loss_scale_policy(const std::string& policy, const std::string& precision) {
  if (policy != "auto") return policy;
  return precision == "fp16" ? "dynamic" : "none";
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code error;
  MIXPREC_CHECK(fs::exists(path, error), "config file '", path, "' not found");
  MIXPREC_CHECK(!fs::is_directory(path, error), "config file '", path,
                "' is a directory, not a YAML file");
  std::ifstream file(path, std::ios::binary);
  MIXPREC_CHECK(file, "config file '", path, "' cannot be read");
  std::ostringstream text;
  text << file.rdbuf();
  const fs::path absolute = fs::absolute(path).lexically_normal();
  TrainConfig config =
      parse_train_config(text.str(), path, absolute.parent_path().string(), overrides);
  config.source_path = absolute.string();
  return config;
}

}  // namespace mixprec
