// Thread-local switches of the autograd engine.
#pragma once

#include <string>

namespace mixprec {

// Recording is on by default; NoGradGuard turns it off for its scope (inference, optimizer
// updates).
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Anomaly mode checks every op's output in forward and every gradient in backward for
// Inf/NaN and throws naming the first op (and its layer) that produced one. Costs a pass
// over every tensor, so it is off by default.
bool anomaly_mode_enabled();
class AnomalyModeGuard {
 public:
  explicit AnomalyModeGuard(bool enabled = true);
  ~AnomalyModeGuard();
  AnomalyModeGuard(const AnomalyModeGuard&) = delete;
  AnomalyModeGuard& operator=(const AnomalyModeGuard&) = delete;

 private:
  bool previous_;
};

// Names the layer that the ops recorded in this scope belong to ("features.3"); nested
// scopes join with '.'. A module called through Module::operator() opens one with its full
// dotted name (`nested` false: the name replaces the enclosing one, since a module knows its
// whole path; an empty name then keeps the enclosing one).
std::string current_layer_name();
class LayerScope {
 public:
  explicit LayerScope(const std::string& name, bool nested = true);
  ~LayerScope();
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

 private:
  std::string previous_;
};

}  // namespace mixprec
