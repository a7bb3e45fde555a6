#include "apps/config/config_overrides.h"

#include <regex>
#include <sstream>
#include <utility>

#include "apps/config/yaml_values.h"
#include "apps/config/train_config.h"
#include "core/error.h"

namespace mixprec::config_loader {
namespace {

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

[[noreturn]] void fail_override(const std::string& origin, const Override& override_,
                                const std::string& why) {
  MIXPREC_FAIL(origin, ": --set '", override_.text, "': ", why);
}

Override parse_override(const std::string& origin, const std::string& text) {
  Override result;
  result.text = text;
  const size_t equals = text.find('=');
  if (equals == std::string::npos)
    fail_override(origin, result, "expected key.path=value, e.g. train.steps=100");
  result.key_path = trim(text.substr(0, equals));
  result.value = text.substr(equals + 1);
  if (result.key_path.empty()) fail_override(origin, result, "the key before '=' is empty");
  std::stringstream parts(result.key_path);
  std::string part;
  static const std::regex kStep(R"(([^\[\]]+)((\[[0-9]{1,9}\])*))");
  static const std::regex kIndex(R"(\[([0-9]{1,9})\])");
  size_t dots = 0;
  for (char c : result.key_path) dots += c == '.';
  while (std::getline(parts, part, '.')) {
    std::smatch match;
    if (!std::regex_match(part, match, kStep))
      fail_override(origin, result,
                    part.empty() ? "the key path '" + result.key_path + "' has an empty part"
                                 : "'" + part + "' is not a key or key[index]");
    OverrideStep step;
    step.key = match[1].str();
    const std::string indices = match[2].str();
    for (std::sregex_iterator it(indices.begin(), indices.end(), kIndex), end; it != end; ++it)
      step.indices.push_back(std::stoul((*it)[1].str()));
    result.steps.push_back(std::move(step));
  }
  if (result.steps.size() != dots + 1)  // a trailing '.' yields no last part from getline
    fail_override(origin, result, "the key path '" + result.key_path + "' has an empty part");
  return result;
}

// Sets the value of `override_` in `root` (a map), creating the maps on its way.
void apply_override(const std::string& origin, YAML::Node& root, const Override& override_) {
  YAML::Node value;
  try {
    value.reset(YAML::Load(override_.value));
  } catch (const YAML::ParserException& error) {
    fail_override(origin, override_, "malformed value '" + override_.value + "': " + error.msg);
  }
  // `node` is a handle that moves down the tree: reset() rebinds it, while operator= would
  // overwrite the node it points to.
  YAML::Node node;
  node.reset(root);
  std::string path;
  for (size_t s = 0; s < override_.steps.size(); ++s) {
    const OverrideStep& step = override_.steps[s];
    const bool last = s + 1 == override_.steps.size();
    if (!node.IsMap())
      fail_override(origin, override_, "'" + path + "' is " + describe(node) + ", not a map");
    path = join_key(path, step.key);
    if (last && step.indices.empty()) {
      node[step.key] = value;
      return;
    }
    YAML::Node next = node[step.key];
    if (!next.IsDefined() || next.IsNull()) {
      if (!step.indices.empty())
        fail_override(origin, override_, "there is no list '" + path + "' to index");
      node[step.key] = YAML::Node(YAML::NodeType::Map);
      next.reset(node[step.key]);
    }
    node.reset(next);
    for (size_t k = 0; k < step.indices.size(); ++k) {
      const size_t index = step.indices[k];
      if (!node.IsSequence())
        fail_override(origin, override_, "'" + path + "' is " + describe(node) + ", not a list");
      if (index >= node.size())
        fail_override(origin, override_,
                      "index " + std::to_string(index) + " is past the end of '" + path + "' (" +
                          std::to_string(node.size()) + " items)");
      if (last && k + 1 == step.indices.size()) {
        node[index] = value;
        return;
      }
      YAML::Node element = node[index];
      node.reset(element);
      path = item_path(path, index);
    }
  }
}

// apply_overrides, which with `skip_refused` leaves out a text it cannot parse or apply (and
// whatever maps it created on its way) instead of failing on it.
std::vector<Override> apply_all(const std::string& origin, YAML::Node& root,
                                const std::vector<std::string>& texts, bool skip_refused) {
  std::vector<Override> parsed;
  bool set_epochs = false, set_steps = false;
  for (const std::string& text : texts) {
    const YAML::Node before = skip_refused ? YAML::Clone(root) : YAML::Node();
    try {
      Override override_ = parse_override(origin, text);
      apply_override(origin, root, override_);
      parsed.push_back(std::move(override_));
    } catch (const Error&) {
      if (!skip_refused) throw;
      root.reset(before);
      continue;
    }
    set_epochs = set_epochs || parsed.back().key_path == "train.epochs";
    set_steps = set_steps || parsed.back().key_path == "train.steps";
  }
  // `--set train.steps=N` on a config that says `epochs` replaces it (and the other way round)
  // instead of asking for both.
  if (set_epochs != set_steps && root["train"].IsMap()) {
    YAML::Node train = root["train"];
    train.remove(set_steps ? "epochs" : "steps");
  }
  return parsed;
}

}  // namespace

std::vector<Override> apply_overrides(const std::string& origin, YAML::Node& root,
                                      const std::vector<std::string>& texts) {
  return apply_all(origin, root, texts, false);
}

}  // namespace mixprec::config_loader

namespace mixprec {

bool overrides_set_key(const std::vector<std::string>& overrides, const std::string& key_path) {
  // The texts applied to an empty tree hold exactly what they set. One that cannot apply there
  // (an index into a list only the file has) cannot reach a key path without indices.
  YAML::Node root(YAML::NodeType::Map);
  config_loader::apply_all("--set", root, overrides, true);
  YAML::Node node;
  node.reset(root);
  std::stringstream parts(key_path);
  std::string part;
  while (std::getline(parts, part, '.')) {
    if (!node.IsMap()) return false;
    const YAML::Node next = std::as_const(node)[part];  // const: a look-up adds no key
    if (!next.IsDefined()) return false;
    node.reset(next);
  }
  return !key_path.empty();
}

}  // namespace mixprec
