#include "core/autograd/grad_mode.h"

namespace mixprec {
namespace {
thread_local bool tls_grad_enabled = true;
thread_local bool tls_anomaly_mode = false;
thread_local std::string tls_layer_name;
}  // namespace

bool grad_enabled() { return tls_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(tls_grad_enabled) { tls_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tls_grad_enabled = previous_; }

bool anomaly_mode_enabled() { return tls_anomaly_mode; }
AnomalyModeGuard::AnomalyModeGuard(bool enabled) : previous_(tls_anomaly_mode) {
  tls_anomaly_mode = enabled;
}
AnomalyModeGuard::~AnomalyModeGuard() { tls_anomaly_mode = previous_; }

std::string current_layer_name() { return tls_layer_name; }
LayerScope::LayerScope(const std::string& name, bool nested) : previous_(tls_layer_name) {
  if (!nested) {
    if (!name.empty()) tls_layer_name = name;
    return;
  }
  tls_layer_name = previous_.empty() ? name : previous_ + "." + name;
}
LayerScope::~LayerScope() { tls_layer_name = previous_; }

}  // namespace mixprec
