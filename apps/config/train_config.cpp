// The YAML loader: parse, apply --set overrides to the tree, then walk the tree once, section
// by section, checking every key, type and range before a value lands in TrainConfig.
//
// yaml-cpp's as<T>() accepts too much for a config that decides hours of training ("1" and
// "yes" as bool, "12.5" truncated to an int, a quoted "128" as a number), so scalars are
// parsed here by hand with the YAML 1.2 core-schema spellings and nothing else.
#include "apps/config/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <regex>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "apps/config/suggest.h"
#include "core/error.h"

namespace mixprec {
namespace {

namespace fs = std::filesystem;

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

// `path` is `prefix` or lies below it ("train.steps" within "train", "model.layers[0]" within
// "model.layers").
bool within(const std::string& path, const std::string& prefix) {
  if (path.size() < prefix.size() || path.compare(0, prefix.size(), prefix) != 0) return false;
  if (path.size() == prefix.size() || prefix.empty()) return true;
  return path[prefix.size()] == '.' || path[prefix.size()] == '[';
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The shortest text that reads back to the same double, spelled as a YAML float: a mantissa
// always has a '.', so the file shows which settings are real numbers and YAML 1.1 readers
// (PyYAML) also read 1.0e-08 as a float rather than the string "1e-08".
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

// A quoted scalar ("128", '1') or one tagged !!str is a string whatever it spells.
bool is_quoted(const YAML::Node& node) {
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

// What a node is, for "expected X, got Y".
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

// The text a value was written as, for "got ..." in range errors.
std::string raw(const YAML::Node& node) { return node.IsScalar() ? node.Scalar() : describe(node); }

// Integers: decimal digits with an optional sign, nothing else (no 1e3, no 12.0).
enum class IntParse { Ok, NotInteger, OutOfRange };

template <class T>
IntParse parse_integer(std::string_view text, T& out) {
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

// The YAML 1.2 core schema's numbers: integers, decimals, exponents, .inf and .nan.
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

// The allowed values of an integer setting.
// Every integer setting has an upper bound too: far beyond any real run, but low enough that
// products of settings (batch_size * block_size, eval_batches * batch_size, ...) cannot
// overflow and a typo cannot ask for exabytes.
struct IntRange {
  std::optional<int64_t> min;
  std::optional<int64_t> max;
  static IntRange at_least(int64_t min) { return IntRange{min, std::nullopt}; }
  static IntRange between(int64_t min, int64_t max) { return IntRange{min, max}; }
};

constexpr int64_t kMaxExtent = int64_t{1} << 20;    // sizes of layers, batches, windows
constexpr int64_t kMaxCount = int64_t{1} << 40;     // steps and other counts of events
constexpr int64_t kMaxInt32 = 2147483647;           // settings the scaler keeps as int

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
  bool allows(double value) const {
    if (!std::isfinite(value)) return false;
    if (min && (min_open ? value <= *min : value < *min)) return false;
    if (max && (max_open ? value >= *max : value > *max)) return false;
    return true;
  }
  std::string requirement() const {
    std::string text = "must be finite";
    auto bound = [](double v) {
      std::string s = format_number(v);
      return s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0 ? s.substr(0, s.size() - 2) : s;
    };
    if (min) text = std::string("must be ") + (min_open ? "> " : ">= ") + bound(*min);
    if (max)
      text += std::string(min ? " and " : "must be ") + (max_open ? "< " : "<= ") + bound(*max);
    return text;
  }
};

// Where an unknown key might have been meant to go.
struct KeyHints {
  std::vector<std::pair<std::string, std::string>> synonyms;  // other spelling -> known key
  std::vector<std::string> elsewhere;  // keys that are valid for another type or kind
  std::string elsewhere_note;          // what to say about those: "a setting of type gpt"
};

// One "--set key.path=value", split: model.layers[0].conv=64 -> (model, {}), (layers, {0}),
// (conv, {}).
struct OverrideStep {
  std::string key;
  std::vector<size_t> indices;
};

struct Override {
  std::string text;  // as given
  std::string key_path;
  std::string value;
  std::vector<OverrideStep> steps;
};

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

// Sets the value of `override_` in `root` (a map), creating the maps on its way; the value is
// parsed as YAML, so "[0.9, 0.95]" is a list and "100" a number.
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

const std::vector<std::string> kRootKeys = {"name",       "model",     "data",     "precision",
                                            "loss_scale", "optimizer", "schedule", "train",
                                            "checkpoint", "device",    "debug"};
const std::vector<std::string> kCnnKeys = {"type", "in_channels", "input_size", "layers"};
const std::vector<std::string> kGptKeys = {"type",    "vocab_size", "block_size",
                                           "n_layer", "n_head",     "n_embd",
                                           "dropout", "bias",       "tie_weights"};
const std::vector<std::string> kIdxKeys = {
    "kind",        "train_images", "train_labels", "test_images", "test_labels",
    "num_classes", "normalize",    "limit_train",  "limit_test",  "shuffle"};
const std::vector<std::string> kTextKeys = {"kind", "path", "val_fraction", "eval_batches",
                                            "shuffle"};

struct LayerKindName {
  CnnLayerSpec::Kind kind;
  const char* name;
  bool takes_value;
  const char* example;  // how to write it
};

const std::vector<LayerKindName>& layer_kinds() {
  using Kind = CnnLayerSpec::Kind;
  static const std::vector<LayerKindName> kinds = {
      {Kind::Conv, "conv", true, "{conv: 32, kernel: 3, padding: 1}"},
      {Kind::BatchNorm, "batchnorm", false, "batchnorm"},
      {Kind::ReLU, "relu", false, "relu"},
      {Kind::GELU, "gelu", false, "gelu"},
      {Kind::MaxPool, "maxpool", true, "{maxpool: 2}"},
      {Kind::AvgPool, "avgpool", true, "{avgpool: 2}"},
      {Kind::Flatten, "flatten", false, "flatten"},
      {Kind::Linear, "linear", true, "{linear: 128}"},
      {Kind::Dropout, "dropout", true, "{dropout: 0.1}"},
  };
  return kinds;
}

const LayerKindName* find_layer_kind(const std::string& name) {
  for (const LayerKindName& kind : layer_kinds())
    if (name == kind.name) return &kind;
  return nullptr;
}

const LayerKindName& layer_kind_entry(CnnLayerSpec::Kind kind) {
  for (const LayerKindName& entry : layer_kinds())
    if (entry.kind == kind) return entry;
  MIXPREC_FAIL("to_yaml: unknown CNN layer kind ", static_cast<int>(kind));
}

std::vector<std::string> layer_kind_names() {
  std::vector<std::string> names;
  for (const LayerKindName& kind : layer_kinds()) names.push_back(kind.name);
  return names;
}

class ConfigReader {
 public:
  ConfigReader(std::string origin, fs::path base_dir, std::vector<Override> overrides)
      : origin_(std::move(origin)),
        base_dir_(std::move(base_dir)),
        overrides_(std::move(overrides)) {}

  TrainConfig read(const YAML::Node& root, const std::string& default_name) const {
    TrainConfig config;
    check_keys(root, "", kRootKeys,
               {{{"dataset", "data"},
                 {"optim", "optimizer"},
                 {"scheduler", "schedule"},
                 {"lr_schedule", "schedule"},
                 {"training", "train"},
                 {"scaler", "loss_scale"},
                 {"loss_scaling", "loss_scale"},
                 {"amp", "precision"}},
                {},
                ""});
    config.name = default_name;
    if (read_string(root, "", "name", config.name) && config.name.empty())
      fail(root["name"], "name", "name must not be empty");

    if (!present(root, "model"))
      fail(root, "", "the model section is missing (model: {type: cnn | gpt, ...})");
    read_model(section(root, "", "model"), "model", config.model);
    if (!present(root, "data"))
      fail(root, "", "the data section is missing (data: {train_images: ...} or {path: ...})");
    read_data(section(root, "", "data"), "data", config.data);

    read_choice(root, "", "precision", config.precision, {"fp32", "fp16", "bf16"});
    read_loss_scale(section(root, "", "loss_scale"), "loss_scale", config.precision,
                    config.loss_scale);
    read_optimizer(section(root, "", "optimizer"), "optimizer", config.optimizer);
    read_schedule(section(root, "", "schedule"), "schedule", config.optimizer.lr, config.schedule);
    read_train(section(root, "", "train"), "train", config.train);
    read_checkpoint(section(root, "", "checkpoint"), "checkpoint", config.checkpoint);
    read_choice(root, "", "device", config.device, {"cpu", "cuda", "auto"});
    read_debug(section(root, "", "debug"), "debug", config.debug);
    return config;
  }

 private:
  // --- Messages --------------------------------------------------------------------------

  [[noreturn]] void fail(const YAML::Node& node, const std::string& path,
                         const std::string& message) const {
    throw Error(origin_ + ": " + message + where(node, path));
  }

  // " (from --set ...)" for a value an override wrote, " (line N)" for one from the file.
  std::string where(const YAML::Node& node, const std::string& path) const {
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

  [[noreturn]] void fail_type(const YAML::Node& node, const std::string& path,
                              const std::string& expected) const {
    fail(node, path, path + ": expected " + expected + ", got " + describe(node));
  }

  [[noreturn]] void fail_range(const YAML::Node& node, const std::string& path,
                               const std::string& requirement) const {
    fail(node, path, path + " " + requirement + ", got " + raw(node));
  }

  // --- Maps ------------------------------------------------------------------------------

  static bool present(const YAML::Node& map, const std::string& key) {
    const YAML::Node child = map[key];
    return child.IsDefined() && !child.IsNull();
  }

  // The map under `key`, or an empty map when the key is absent or null (a section whose
  // settings are all commented out).
  YAML::Node section(const YAML::Node& parent, const std::string& parent_path,
                     const std::string& key) const {
    const YAML::Node child = parent[key];
    if (!child.IsDefined() || child.IsNull()) return YAML::Node(YAML::NodeType::Map);
    const std::string path = join_key(parent_path, key);
    if (!child.IsMap()) fail_type(child, path, "a map");
    return child;
  }

  // Every key of `map` must be one of `allowed`, and appear once.
  void check_keys(const YAML::Node& map, const std::string& path,
                  const std::vector<std::string>& allowed, const KeyHints& hints = {}) const {
    std::vector<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node& key_node = it->first;
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

  // --- Scalars ---------------------------------------------------------------------------

  int64_t to_int(const YAML::Node& node, const std::string& path) const {
    int64_t value = 0;
    if (!node.IsScalar() || is_quoted(node)) fail_type(node, path, "an integer");
    const IntParse parsed = parse_integer(node.Scalar(), value);
    if (parsed == IntParse::NotInteger) fail_type(node, path, "an integer");
    if (parsed == IntParse::OutOfRange)
      fail(node, path, path + ": " + node.Scalar() + " does not fit a 64-bit integer");
    return value;
  }

  uint64_t to_uint(const YAML::Node& node, const std::string& path) const {
    const std::string text = node.IsScalar() ? node.Scalar() : "";
    if (!node.IsScalar() || is_quoted(node)) fail_type(node, path, "an integer");
    if (!text.empty() && text[0] == '-') {
      int64_t negative = 0;
      if (parse_integer(text, negative) == IntParse::NotInteger)
        fail_type(node, path, "an integer");
      fail_range(node, path, "must be >= 0");
    }
    uint64_t value = 0;
    const IntParse parsed = parse_integer(text, value);
    if (parsed == IntParse::NotInteger) fail_type(node, path, "an integer");
    if (parsed == IntParse::OutOfRange)
      fail(node, path, path + ": " + text + " does not fit an unsigned 64-bit integer");
    return value;
  }

  double to_double(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar() || is_quoted(node)) fail_type(node, path, "a number");
    const std::optional<double> value = parse_double(node.Scalar());
    if (!value) fail_type(node, path, "a number");
    return *value;
  }

  bool to_bool(const YAML::Node& node, const std::string& path) const {
    if (node.IsScalar() && !is_quoted(node)) {
      const std::string& text = node.Scalar();
      if (text == "true" || text == "True" || text == "TRUE") return true;
      if (text == "false" || text == "False" || text == "FALSE") return false;
    }
    fail_type(node, path, "true or false");
  }

  std::string to_string(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar()) fail_type(node, path, "a string");
    return node.Scalar();
  }

  std::string to_choice(const YAML::Node& node, const std::string& path,
                        const std::vector<std::string>& choices) const {
    if (!node.IsScalar()) fail_type(node, path, "one of " + join_list(choices));
    const std::string value = node.Scalar();
    if (contains(choices, value)) return value;
    std::string message = path + " must be one of " + join_list(choices) + ", got '" + value + "'";
    if (const auto suggestion = closest_match(value, choices))
      message += " (did you mean '" + *suggestion + "'?)";
    fail(node, path, message);
  }

  void check_int(const YAML::Node& node, const std::string& path, int64_t value,
                 const IntRange& range) const {
    if (range.min && value < *range.min)
      fail_range(node, path, "must be >= " + std::to_string(*range.min));
    if (range.max && value > *range.max)
      fail_range(node, path, "must be <= " + std::to_string(*range.max));
  }

  void check_double(const YAML::Node& node, const std::string& path, double value,
                    const DoubleRange& range) const {
    if (range.allows(value)) return;
    if (!std::isfinite(value)) fail_range(node, path, "must be finite");
    fail_range(node, path, range.requirement());
  }

  // Keyed reads: each leaves `out` as it is when `key` is absent and says whether it read.
  bool read_int(const YAML::Node& map, const std::string& map_path, const std::string& key,
                int64_t& out, const IntRange& range = {}) const {
    const YAML::Node node = map[key];
    if (!node.IsDefined()) return false;
    const std::string path = join_key(map_path, key);
    out = to_int(node, path);
    check_int(node, path, out, range);
    return true;
  }

  bool read_double(const YAML::Node& map, const std::string& map_path, const std::string& key,
                   double& out, const DoubleRange& range) const {
    const YAML::Node node = map[key];
    if (!node.IsDefined()) return false;
    const std::string path = join_key(map_path, key);
    out = to_double(node, path);
    check_double(node, path, out, range);
    return true;
  }

  bool read_bool(const YAML::Node& map, const std::string& map_path, const std::string& key,
                 bool& out) const {
    const YAML::Node node = map[key];
    if (!node.IsDefined()) return false;
    out = to_bool(node, join_key(map_path, key));
    return true;
  }

  bool read_string(const YAML::Node& map, const std::string& map_path, const std::string& key,
                   std::string& out) const {
    const YAML::Node node = map[key];
    if (!node.IsDefined()) return false;
    out = to_string(node, join_key(map_path, key));
    return true;
  }

  bool read_choice(const YAML::Node& map, const std::string& map_path, const std::string& key,
                   std::string& out, const std::vector<std::string>& choices) const {
    const YAML::Node node = map[key];
    if (!node.IsDefined()) return false;
    out = to_choice(node, join_key(map_path, key), choices);
    return true;
  }

  // --- Sections --------------------------------------------------------------------------

  void read_model(const YAML::Node& map, const std::string& path, ModelConfig& model) const {
    std::string type = "cnn";
    read_choice(map, path, "type", type, {"cnn", "gpt"});
    if (type == "cnn") {
      model.type = ModelConfig::Type::Cnn;
      check_keys(map, path, kCnnKeys,
                 {{{"channels", "in_channels"}, {"image_size", "input_size"}},
                  {kGptKeys.begin() + 1, kGptKeys.end()},
                  "a setting of type gpt, not cnn"});
      read_int(map, path, "in_channels", model.cnn.in_channels, IntRange::between(1, kMaxExtent));
      read_int(map, path, "input_size", model.cnn.input_size, IntRange::between(1, kMaxExtent));
      read_layers(map, path, model.cnn);
    } else {
      model.type = ModelConfig::Type::Gpt;
      check_keys(map, path, kGptKeys,
                 {{{"n_layers", "n_layer"},
                   {"n_heads", "n_head"},
                   {"d_model", "n_embd"},
                   {"context_length", "block_size"},
                   {"vocab", "vocab_size"}},
                  {kCnnKeys.begin() + 1, kCnnKeys.end()},
                  "a setting of type cnn, not gpt"});
      GptSpec& gpt = model.gpt;
      read_int(map, path, "vocab_size", gpt.vocab_size, IntRange::between(0, kMaxExtent));
      read_int(map, path, "block_size", gpt.block_size, IntRange::between(1, kMaxExtent));
      read_int(map, path, "n_layer", gpt.n_layer, IntRange::between(1, kMaxExtent));
      read_int(map, path, "n_head", gpt.n_head, IntRange::between(1, kMaxExtent));
      read_int(map, path, "n_embd", gpt.n_embd, IntRange::between(1, kMaxExtent));
      read_double(map, path, "dropout", gpt.dropout, DoubleRange::between(0.0, false, 1.0, true));
      read_bool(map, path, "bias", gpt.bias);
      read_bool(map, path, "tie_weights", gpt.tie_weights);
      if (gpt.n_embd % gpt.n_head != 0) {
        const std::string n_embd_path = join_key(path, "n_embd");
        fail(map["n_embd"].IsDefined() ? map["n_embd"] : map, n_embd_path,
             n_embd_path + " (" + std::to_string(gpt.n_embd) + ") must be divisible by " + path +
                 ".n_head (" + std::to_string(gpt.n_head) + ")");
      }
    }
  }

  void read_layers(const YAML::Node& map, const std::string& model_path, CnnSpec& cnn) const {
    const std::string path = join_key(model_path, "layers");
    const YAML::Node layers = map["layers"];
    if (!layers.IsDefined() || layers.IsNull())
      fail(map, model_path,
           path +
               " is missing: a cnn needs its list of layers, e.g. "
               "[{conv: 32}, relu, flatten, {linear: 10}]");
    if (!layers.IsSequence()) fail_type(layers, path, "a list of layers");
    if (layers.size() == 0) fail(layers, path, path + " must not be empty");
    cnn.layers.clear();
    for (size_t i = 0; i < layers.size(); ++i)
      cnn.layers.push_back(read_layer(layers[i], item_path(path, i)));
  }

  [[noreturn]] void fail_unknown_layer(const YAML::Node& node, const std::string& path,
                                       const std::string& name) const {
    std::string message = path + ": unknown layer '" + name + "'";
    if (const auto suggestion = closest_match(name, layer_kind_names()))
      message += " (did you mean '" + *suggestion + "'?)";
    else
      message += "; the layers are " + join_list(layer_kind_names());
    fail(node, path, message);
  }

  CnnLayerSpec read_layer(const YAML::Node& item, const std::string& path) const {
    using Kind = CnnLayerSpec::Kind;
    CnnLayerSpec layer;
    if (item.IsScalar()) {
      const std::string name = item.Scalar();
      const LayerKindName* kind = find_layer_kind(name);
      if (!kind) fail_unknown_layer(item, path, name);
      if (kind->takes_value)
        fail(item, path, path + ": layer '" + name + "' needs a value, as in " + kind->example);
      layer.kind = kind->kind;
      return layer;
    }
    if (!item.IsMap() || item.size() == 0)
      fail(item, path,
           path +
               ": expected a layer name such as relu or a map such as "
               "{conv: 32, kernel: 3}, got " +
               describe(item));

    // The first key names the kind; the rest are its options.
    const auto first = item.begin();
    if (!first->first.IsScalar()) fail_type(first->first, path, "a layer name as the first key");
    const std::string name = first->first.Scalar();
    const LayerKindName* kind = find_layer_kind(name);
    if (!kind) {
      for (auto it = item.begin(); it != item.end(); ++it)
        if (it->first.IsScalar() && find_layer_kind(it->first.Scalar()))
          fail(first->first, path,
               path + ": the first key of a layer names its kind, but '" + name +
                   "' comes before '" + it->first.Scalar() + "'");
      fail_unknown_layer(first->first, path, name);
    }
    layer.kind = kind->kind;
    const YAML::Node value = first->second;
    const std::string value_path = join_key(path, name);
    if (!kind->takes_value) {
      if (!value.IsNull() || item.size() != 1)
        fail(item, path,
             path + ": layer '" + name +
                 "' takes no value or options; write it "
                 "as '- " +
                 name + "'");
      return layer;
    }

    // An unknown key that is itself a layer kind is a layer written inside the wrong item.
    KeyHints hints{{}, {}, "a layer of its own: give each layer its own list item"};
    for (const std::string& other : layer_kind_names())
      if (other != name) hints.elsewhere.push_back(other);
    switch (layer.kind) {
      case Kind::Conv:
        check_keys(item, path, {"conv", "kernel", "padding", "stride", "bias"}, hints);
        layer.out = to_int(value, value_path);
        check_int(value, value_path, layer.out, IntRange::between(1, kMaxExtent));
        read_int(item, path, "kernel", layer.kernel, IntRange::between(1, kMaxExtent));
        read_int(item, path, "padding", layer.padding, IntRange::between(0, kMaxExtent));
        read_int(item, path, "stride", layer.stride, IntRange::between(1, kMaxExtent));
        read_bool(item, path, "bias", layer.bias);
        break;
      case Kind::MaxPool:
      case Kind::AvgPool: {
        check_keys(item, path, {name, "stride", "padding"}, hints);
        layer.kernel = to_int(value, value_path);
        check_int(value, value_path, layer.kernel, IntRange::between(1, kMaxExtent));
        layer.stride = layer.kernel;
        read_int(item, path, "stride", layer.stride, IntRange::between(1, kMaxExtent));
        read_int(item, path, "padding", layer.padding, IntRange::between(0, kMaxExtent));
        // PyTorch's rule: a window must always overlap the unpadded input.
        if (layer.padding > layer.kernel / 2)
          fail_range(item["padding"], join_key(path, "padding"),
                     "must be <= kernel / 2 = " + std::to_string(layer.kernel / 2));
        break;
      }
      case Kind::Linear:
        check_keys(item, path, {"linear", "bias"}, hints);
        layer.out = to_int(value, value_path);
        check_int(value, value_path, layer.out, IntRange::between(1, kMaxExtent));
        read_bool(item, path, "bias", layer.bias);
        break;
      case Kind::Dropout:
        check_keys(item, path, {"dropout"}, hints);
        layer.p = to_double(value, value_path);
        check_double(value, value_path, layer.p, DoubleRange::between(0.0, false, 1.0, true));
        break;
      default:
        break;
    }
    return layer;
  }

  // An existing file for a data path: absolute as given, relative against the config's
  // folder first and then the working directory.
  std::string resolve_data_path(const YAML::Node& node, const std::string& path,
                                const std::string& value) const {
    if (value.empty()) fail(node, path, path + " must not be empty");
    const fs::path given(value);
    std::error_code error;
    auto is_file = [&error](const fs::path& p) {
      return fs::exists(p, error) && !fs::is_directory(p, error);
    };
    if (given.is_absolute()) {
      if (is_file(given)) return given.lexically_normal().string();
      fail(node, path, path + ": file '" + value + "' not found");
    }
    const fs::path next_to_config = (base_dir_ / given).lexically_normal();
    const fs::path in_working_dir = (fs::current_path() / given).lexically_normal();
    if (is_file(next_to_config)) return next_to_config.string();
    if (is_file(in_working_dir)) return in_working_dir.string();
    fail(node, path,
         path + ": file '" + value + "' not found (looked for '" + next_to_config.string() +
             "' next to the config and for '" + in_working_dir.string() +
             "' in the working directory)");
  }

  void read_data_path(const YAML::Node& map, const std::string& map_path, const std::string& key,
                      const std::string& kind, std::string& out) const {
    const std::string path = join_key(map_path, key);
    const YAML::Node node = map[key];
    if (!node.IsDefined() || node.IsNull())
      fail(map, map_path, path + " is missing (required for kind " + kind + ")");
    out = resolve_data_path(node, path, to_string(node, path));
  }

  void read_data(const YAML::Node& map, const std::string& path, DataConfig& data) const {
    std::string kind;
    if (!read_choice(map, path, "kind", kind, {"idx", "text"})) {
      if (map["train_images"].IsDefined())
        kind = "idx";
      else if (map["path"].IsDefined())
        kind = "text";
      else
        fail(map, path,
             path +
                 " names no data: give train_images, train_labels, test_images "
                 "and test_labels (kind idx) or path (kind text)");
    }
    if (kind == "idx") {
      data.kind = DataConfig::Kind::Idx;
      check_keys(map, path, kIdxKeys,
                 {{{"num_labels", "num_classes"}, {"classes", "num_classes"}},
                  {kTextKeys.begin() + 1, kTextKeys.end() - 1},
                  "a setting of kind text, not idx"});
      read_data_path(map, path, "train_images", kind, data.train_images);
      read_data_path(map, path, "train_labels", kind, data.train_labels);
      read_data_path(map, path, "test_images", kind, data.test_images);
      read_data_path(map, path, "test_labels", kind, data.test_labels);
      read_int(map, path, "num_classes", data.num_classes, IntRange::between(2, kMaxExtent));
      const YAML::Node normalize = section(map, path, "normalize");
      const std::string normalize_path = join_key(path, "normalize");
      if (normalize.size() > 0) {
        check_keys(normalize, normalize_path, {"mean", "std"});
        for (const char* key : {"mean", "std"})
          if (!normalize[key].IsDefined())
            fail(normalize, normalize_path,
                 normalize_path + "." + key + " is missing: normalize needs both mean and std");
        double mean = 0.0, std = 1.0;
        read_double(normalize, normalize_path, "mean", mean, DoubleRange::finite());
        read_double(normalize, normalize_path, "std", std, DoubleRange::above(0.0));
        data.mean = mean;
        data.std = std;
      }
      read_int(map, path, "limit_train", data.limit_train, IntRange::between(0, kMaxCount));
      read_int(map, path, "limit_test", data.limit_test, IntRange::between(0, kMaxCount));
    } else {
      data.kind = DataConfig::Kind::CharText;
      check_keys(map, path, kTextKeys,
                 {{{"file", "path"}, {"val_split", "val_fraction"}},
                  {kIdxKeys.begin() + 1, kIdxKeys.end() - 1},
                  "a setting of kind idx, not text"});
      read_data_path(map, path, "path", kind, data.path);
      read_double(map, path, "val_fraction", data.val_fraction,
                  DoubleRange::between(0.0, true, 1.0, true));
      read_int(map, path, "eval_batches", data.eval_batches, IntRange::between(1, kMaxExtent));
    }
    read_bool(map, path, "shuffle", data.shuffle);
  }

  void read_loss_scale(const YAML::Node& map, const std::string& path, const std::string& precision,
                       LossScaleConfig& scale) const {
    check_keys(map, path,
               {"policy", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                "hysteresis", "min_scale", "max_scale", "floor_policy"},
               {{{"scale", "init_scale"},
                 {"initial_scale", "init_scale"},
                 {"type", "policy"},
                 {"kind", "policy"}},
                {},
                ""});
    read_choice(map, path, "policy", scale.policy, {"auto", "dynamic", "static", "none"});
    read_double(map, path, "init_scale", scale.init_scale, DoubleRange::above(0.0));
    read_double(map, path, "growth_factor", scale.growth_factor, DoubleRange::above(1.0));
    read_double(map, path, "backoff_factor", scale.backoff_factor,
                DoubleRange::between(0.0, true, 1.0, true));
    read_int(map, path, "growth_interval", scale.growth_interval, IntRange::between(1, kMaxInt32));
    read_int(map, path, "hysteresis", scale.hysteresis, IntRange::between(1, kMaxInt32));
    read_double(map, path, "min_scale", scale.min_scale, DoubleRange::above(0.0));
    read_double(map, path, "max_scale", scale.max_scale, DoubleRange::above(0.0));
    read_choice(map, path, "floor_policy", scale.floor_policy, {"clamp", "warn", "error"});

    const YAML::Node max_node = map["max_scale"].IsDefined() ? map["max_scale"] : map;
    const std::string max_path = join_key(path, "max_scale");
    if (scale.max_scale < scale.min_scale)
      fail(max_node, max_path,
           max_path + " (" + format_number(scale.max_scale) + ") must be >= " + path +
               ".min_scale (" + format_number(scale.min_scale) + ")");
    // A dynamic scale starts inside its own bounds (auto is dynamic for fp16).
    const bool dynamic =
        scale.policy == "dynamic" || (scale.policy == "auto" && precision == "fp16");
    if (dynamic && (scale.init_scale < scale.min_scale || scale.init_scale > scale.max_scale)) {
      const YAML::Node init_node = map["init_scale"].IsDefined() ? map["init_scale"] : map;
      const std::string init_path = join_key(path, "init_scale");
      fail(init_node, init_path,
           init_path + " (" + format_number(scale.init_scale) + ") must lie within [min_scale, " +
               "max_scale] = [" + format_number(scale.min_scale) + ", " +
               format_number(scale.max_scale) + "] for a dynamic loss scale");
    }
  }

  void read_optimizer(const YAML::Node& map, const std::string& path,
                      OptimizerConfig& optimizer) const {
    check_keys(map, path, {"type", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps"},
               {{{"learning_rate", "lr"},
                 {"beta1", "betas"},
                 {"beta2", "betas"},
                 {"epsilon", "eps"},
                 {"wd", "weight_decay"},
                 {"name", "type"}},
                {},
                ""});
    read_choice(map, path, "type", optimizer.type, {"sgd", "adam", "adamw"});
    read_double(map, path, "lr", optimizer.lr, DoubleRange::at_least(0.0));
    read_double(map, path, "momentum", optimizer.momentum, DoubleRange::at_least(0.0));
    read_bool(map, path, "nesterov", optimizer.nesterov);
    read_double(map, path, "weight_decay", optimizer.weight_decay, DoubleRange::at_least(0.0));
    const YAML::Node betas = map["betas"];
    if (betas.IsDefined()) {
      const std::string betas_path = join_key(path, "betas");
      if (!betas.IsSequence() || betas.size() != 2)
        fail_type(betas, betas_path, "a list of two numbers [beta1, beta2]");
      double* targets[2] = {&optimizer.beta1, &optimizer.beta2};
      for (size_t i = 0; i < 2; ++i) {
        const std::string beta_path = item_path(betas_path, i);
        *targets[i] = to_double(betas[i], beta_path);
        check_double(betas[i], beta_path, *targets[i], DoubleRange::between(0.0, false, 1.0, true));
      }
    }
    read_double(map, path, "eps", optimizer.eps, DoubleRange::above(0.0));
    // torch.optim.SGD refuses Nesterov momentum without momentum; say so before the run.
    if (optimizer.type == "sgd" && optimizer.nesterov && optimizer.momentum <= 0.0) {
      const std::string nesterov_path = join_key(path, "nesterov");
      fail(map["nesterov"], nesterov_path,
           nesterov_path + ": Nesterov momentum needs " + path + ".momentum > 0, got " +
               format_number(optimizer.momentum));
    }
  }

  void read_schedule(const YAML::Node& map, const std::string& path, double base_lr,
                     ScheduleConfig& schedule) const {
    check_keys(map, path, {"type", "step_size", "gamma", "warmup_steps", "decay_steps", "min_lr"},
               {{{"warmup", "warmup_steps"}, {"decay", "decay_steps"}, {"name", "type"}}, {}, ""});
    read_choice(map, path, "type", schedule.type, {"constant", "step", "cosine"});
    read_int(map, path, "step_size", schedule.step_size, IntRange::between(1, kMaxCount));
    read_double(map, path, "gamma", schedule.gamma, DoubleRange::between(0.0, true, 1.0, false));
    read_int(map, path, "warmup_steps", schedule.warmup_steps, IntRange::between(0, kMaxCount));
    read_int(map, path, "decay_steps", schedule.decay_steps, IntRange::between(0, kMaxCount));
    read_double(map, path, "min_lr", schedule.min_lr, DoubleRange::at_least(0.0));
    if (schedule.type != "cosine") return;
    if (schedule.decay_steps > 0 && schedule.decay_steps < schedule.warmup_steps) {
      const std::string decay_path = join_key(path, "decay_steps");
      fail(map["decay_steps"], decay_path,
           decay_path + " (" + std::to_string(schedule.decay_steps) + ") must be 0 (the whole " +
               "run) or >= " + path + ".warmup_steps (" + std::to_string(schedule.warmup_steps) +
               ")");
    }
    if (schedule.min_lr > base_lr) {
      const std::string min_path = join_key(path, "min_lr");
      fail(map["min_lr"], min_path,
           min_path + " (" + format_number(schedule.min_lr) + ") must be <= optimizer.lr (" +
               format_number(base_lr) + ")");
    }
  }

  void read_train(const YAML::Node& map, const std::string& path, TrainLoopConfig& train) const {
    check_keys(map, path,
               {"epochs", "steps", "batch_size", "accumulation_steps", "clip_grad_norm", "seed",
                "eval_every", "log_every"},
               {{{"num_epochs", "epochs"},
                 {"max_steps", "steps"},
                 {"max_iters", "steps"},
                 {"batch", "batch_size"},
                 {"grad_accumulation", "accumulation_steps"},
                 {"gradient_accumulation_steps", "accumulation_steps"},
                 {"grad_clip", "clip_grad_norm"},
                 {"max_grad_norm", "clip_grad_norm"}},
                {},
                ""});
    const bool epochs_given = read_int(map, path, "epochs", train.epochs, IntRange::between(0, kMaxExtent));
    const bool steps_given = read_int(map, path, "steps", train.steps, IntRange::between(0, kMaxCount));
    // A config that names neither runs one epoch, so that the train section stays optional.
    if (!epochs_given && !steps_given) train.epochs = 1;
    if ((train.epochs > 0) == (train.steps > 0)) {
      const YAML::Node at = map["steps"].IsDefined() ? map["steps"] : map["epochs"];
      const std::string at_path = join_key(path, map["steps"].IsDefined() ? "steps" : "epochs");
      fail(at.IsDefined() ? at : map, at_path,
           "exactly one of " + path + ".epochs and " + path + ".steps must be > 0, got epochs " +
               std::to_string(train.epochs) + " and steps " + std::to_string(train.steps));
    }
    read_int(map, path, "batch_size", train.batch_size, IntRange::between(1, kMaxExtent));
    read_int(map, path, "accumulation_steps", train.accumulation_steps, IntRange::between(1, kMaxExtent));
    read_double(map, path, "clip_grad_norm", train.clip_grad_norm, DoubleRange::at_least(0.0));
    const YAML::Node seed = map["seed"];
    if (seed.IsDefined()) train.seed = to_uint(seed, join_key(path, "seed"));
    read_int(map, path, "eval_every", train.eval_every, IntRange::between(0, kMaxCount));
    read_int(map, path, "log_every", train.log_every, IntRange::between(1, kMaxCount));
  }

  void read_checkpoint(const YAML::Node& map, const std::string& path,
                       CheckpointConfig& checkpoint) const {
    check_keys(map, path, {"every", "keep", "save_initial"},
               {{{"keep_last", "keep"}, {"interval", "every"}}, {}, ""});
    read_int(map, path, "every", checkpoint.every, IntRange::between(0, kMaxCount));
    read_int(map, path, "keep", checkpoint.keep, IntRange::between(0, kMaxCount));
    read_bool(map, path, "save_initial", checkpoint.save_initial);
  }

  void read_debug(const YAML::Node& map, const std::string& path, DebugConfig& debug) const {
    check_keys(map, path, {"detect_anomaly", "inject_nonfinite"},
               {{{"anomaly", "detect_anomaly"}}, {}, ""});
    read_bool(map, path, "detect_anomaly", debug.detect_anomaly);
    const YAML::Node inject = section(map, path, "inject_nonfinite");
    if (inject.size() == 0) return;
    const std::string inject_path = join_key(path, "inject_nonfinite");
    check_keys(inject, inject_path, {"step", "tensor", "value"});
    for (const char* key : {"step", "tensor"})
      if (!present(inject, key))
        fail(inject, inject_path,
             inject_path + "." + key +
                 " is missing: injection needs the "
                 "step and the parameter name");
    read_int(inject, inject_path, "step", debug.inject_step, IntRange::between(1, kMaxCount));
    read_string(inject, inject_path, "tensor", debug.inject_tensor);
    if (debug.inject_tensor.empty())
      fail(inject["tensor"], inject_path + ".tensor", inject_path + ".tensor must not be empty");
    read_choice(inject, inject_path, "value", debug.inject_value, {"inf", "nan"});
  }

  std::string origin_;
  fs::path base_dir_;
  std::vector<Override> overrides_;
};

// --- Writing ---------------------------------------------------------------------------

void emit(YAML::Emitter& out, const char* key, const std::string& value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit(YAML::Emitter& out, const char* key, const char* value) {
  out << YAML::Key << key << YAML::Value << std::string(value);
}
void emit(YAML::Emitter& out, const char* key, int64_t value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit(YAML::Emitter& out, const char* key, uint64_t value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit(YAML::Emitter& out, const char* key, bool value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit_number(YAML::Emitter& out, const char* key, double value) {
  out << YAML::Key << key << YAML::Value << format_number(value);
}

void emit_layer(YAML::Emitter& out, const CnnLayerSpec& layer) {
  using Kind = CnnLayerSpec::Kind;
  const LayerKindName& entry = layer_kind_entry(layer.kind);
  if (!entry.takes_value) {
    out << std::string(entry.name);
    return;
  }
  out << YAML::Flow << YAML::BeginMap;
  switch (layer.kind) {
    case Kind::Conv:
      emit(out, "conv", layer.out);
      emit(out, "kernel", layer.kernel);
      emit(out, "padding", layer.padding);
      emit(out, "stride", layer.stride);
      emit(out, "bias", layer.bias);
      break;
    case Kind::MaxPool:
    case Kind::AvgPool:
      emit(out, entry.name, layer.kernel);
      emit(out, "stride", layer.stride);
      emit(out, "padding", layer.padding);
      break;
    case Kind::Linear:
      emit(out, "linear", layer.out);
      emit(out, "bias", layer.bias);
      break;
    case Kind::Dropout:
      emit_number(out, "dropout", layer.p);
      break;
    default:
      break;
  }
  out << YAML::EndMap;
}

}  // namespace

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
                 describe(root));

  std::vector<Override> parsed;
  bool set_epochs = false, set_steps = false;
  for (const std::string& text : overrides) {
    parsed.push_back(parse_override(origin, text));
    apply_override(origin, root, parsed.back());
    set_epochs = set_epochs || parsed.back().key_path == "train.epochs";
    set_steps = set_steps || parsed.back().key_path == "train.steps";
  }
  // The run length is one setting given two ways: `--set train.steps=N` on a config that
  // says `epochs` replaces it (and the other way round) instead of asking for both.
  if (set_epochs != set_steps && root["train"].IsMap()) {
    YAML::Node train = root["train"];
    train.remove(set_steps ? "epochs" : "steps");
  }

  fs::path base = base_dir.empty() ? fs::current_path() : fs::absolute(base_dir);
  std::string default_name = fs::path(origin).stem().string();
  if (default_name.empty()) default_name = "config";
  TrainConfig config;
  try {
    config =
        ConfigReader(origin, base.lexically_normal(), std::move(parsed)).read(root, default_name);
  } catch (const YAML::Exception& error) {
    MIXPREC_FAIL(origin, ": ", error.what());
  }
  config.source_path = origin;
  return config;
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

std::string to_yaml(const TrainConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  emit(out, "name", config.name);

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (config.model.type == ModelConfig::Type::Cnn) {
    const CnnSpec& cnn = config.model.cnn;
    emit(out, "type", "cnn");
    emit(out, "in_channels", cnn.in_channels);
    emit(out, "input_size", cnn.input_size);
    out << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
    for (const CnnLayerSpec& layer : cnn.layers) emit_layer(out, layer);
    out << YAML::EndSeq;
  } else {
    const GptSpec& gpt = config.model.gpt;
    emit(out, "type", "gpt");
    emit(out, "vocab_size", gpt.vocab_size);
    emit(out, "block_size", gpt.block_size);
    emit(out, "n_layer", gpt.n_layer);
    emit(out, "n_head", gpt.n_head);
    emit(out, "n_embd", gpt.n_embd);
    emit_number(out, "dropout", gpt.dropout);
    emit(out, "bias", gpt.bias);
    emit(out, "tie_weights", gpt.tie_weights);
  }
  out << YAML::EndMap;

  const DataConfig& data = config.data;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  if (data.kind == DataConfig::Kind::Idx) {
    emit(out, "kind", "idx");
    emit(out, "train_images", data.train_images);
    emit(out, "train_labels", data.train_labels);
    emit(out, "test_images", data.test_images);
    emit(out, "test_labels", data.test_labels);
    emit(out, "num_classes", data.num_classes);
    if (data.mean || data.std) {
      out << YAML::Key << "normalize" << YAML::Value << YAML::Flow << YAML::BeginMap;
      if (data.mean) emit_number(out, "mean", *data.mean);
      if (data.std) emit_number(out, "std", *data.std);
      out << YAML::EndMap;
    }
    emit(out, "limit_train", data.limit_train);
    emit(out, "limit_test", data.limit_test);
  } else {
    emit(out, "kind", "text");
    emit(out, "path", data.path);
    emit_number(out, "val_fraction", data.val_fraction);
    emit(out, "eval_batches", data.eval_batches);
  }
  emit(out, "shuffle", data.shuffle);
  out << YAML::EndMap;

  emit(out, "precision", config.precision);

  const LossScaleConfig& scale = config.loss_scale;
  out << YAML::Key << "loss_scale" << YAML::Value << YAML::BeginMap;
  emit(out, "policy", scale.policy);
  emit_number(out, "init_scale", scale.init_scale);
  emit_number(out, "growth_factor", scale.growth_factor);
  emit_number(out, "backoff_factor", scale.backoff_factor);
  emit(out, "growth_interval", scale.growth_interval);
  emit(out, "hysteresis", scale.hysteresis);
  emit_number(out, "min_scale", scale.min_scale);
  emit_number(out, "max_scale", scale.max_scale);
  emit(out, "floor_policy", scale.floor_policy);
  out << YAML::EndMap;

  const OptimizerConfig& optimizer = config.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  emit(out, "type", optimizer.type);
  emit_number(out, "lr", optimizer.lr);
  emit_number(out, "momentum", optimizer.momentum);
  emit(out, "nesterov", optimizer.nesterov);
  emit_number(out, "weight_decay", optimizer.weight_decay);
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << format_number(optimizer.beta1) << format_number(optimizer.beta2) << YAML::EndSeq;
  emit_number(out, "eps", optimizer.eps);
  out << YAML::EndMap;

  const ScheduleConfig& schedule = config.schedule;
  out << YAML::Key << "schedule" << YAML::Value << YAML::BeginMap;
  emit(out, "type", schedule.type);
  emit(out, "step_size", schedule.step_size);
  emit_number(out, "gamma", schedule.gamma);
  emit(out, "warmup_steps", schedule.warmup_steps);
  emit(out, "decay_steps", schedule.decay_steps);
  emit_number(out, "min_lr", schedule.min_lr);
  out << YAML::EndMap;

  const TrainLoopConfig& train = config.train;
  out << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  emit(out, "epochs", train.epochs);
  emit(out, "steps", train.steps);
  emit(out, "batch_size", train.batch_size);
  emit(out, "accumulation_steps", train.accumulation_steps);
  emit_number(out, "clip_grad_norm", train.clip_grad_norm);
  emit(out, "seed", train.seed);
  emit(out, "eval_every", train.eval_every);
  emit(out, "log_every", train.log_every);
  out << YAML::EndMap;

  const CheckpointConfig& checkpoint = config.checkpoint;
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  emit(out, "every", checkpoint.every);
  emit(out, "keep", checkpoint.keep);
  emit(out, "save_initial", checkpoint.save_initial);
  out << YAML::EndMap;

  emit(out, "device", config.device);

  const DebugConfig& debug = config.debug;
  out << YAML::Key << "debug" << YAML::Value << YAML::BeginMap;
  emit(out, "detect_anomaly", debug.detect_anomaly);
  // Injection is off unless a step is set; "off" has no spelling of its own in the file.
  if (debug.inject_step >= 0) {
    out << YAML::Key << "inject_nonfinite" << YAML::Value << YAML::BeginMap;
    emit(out, "step", debug.inject_step);
    emit(out, "tensor", debug.inject_tensor);
    emit(out, "value", debug.inject_value);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::EndMap;
  MIXPREC_CHECK(out.good(), "to_yaml: ", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace mixprec
