// How each CNN layer kind is spelled in a config's `model.layers`: its name, whether it takes a
// value (`{conv: 32}`) or stands alone (`relu`), and an example for messages. The reader and
// the writer share this one table, so a file written by to_yaml reads back.
//
// Internal to apps/config.
#pragma once

#include <string>
#include <vector>

#include "layers/model_spec.h"

namespace mixprec::config_loader {

struct LayerKindName {
  CnnLayerSpec::Kind kind;
  const char* name;
  bool takes_value;
  const char* example;  // how to write it
};

// The entry named `name`, or nullptr when no kind has that name.
const LayerKindName* find_layer_kind(const std::string& name);

// The entry of `kind`; throws mixprec::Error for a value outside the enum.
const LayerKindName& layer_kind_entry(CnnLayerSpec::Kind kind);

// Every name, in the table's order (for "did you mean" and "the layers are ...").
std::vector<std::string> layer_kind_names();

}  // namespace mixprec::config_loader
