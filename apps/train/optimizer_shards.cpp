#include "apps/train/optimizer_shards.h"

#include <cstring>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {
namespace {

// A state_dict as bytes: its scalars, and each tensor's name, shape and F32 bytes.
std::vector<uint8_t> to_bytes(const OptimizerState& state) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& [name, tensor] : state.tensors) {
    const Tensor host = tensor.to(kCPU).to(DType::F32);
    std::vector<uint8_t> data(static_cast<size_t>(host.numel()) * sizeof(float));
    if (!data.empty()) std::memcpy(data.data(), host.data(), data.size());
    tensors.push_back({{"name", name}, {"shape", host.shape()}, {"data", nlohmann::json::binary(data)}});
  }
  return nlohmann::json::to_cbor(nlohmann::json{{"scalars", state.scalars}, {"tensors", tensors}});
}

OptimizerState from_bytes(const std::vector<uint8_t>& bytes) {
  const nlohmann::json parsed = nlohmann::json::from_cbor(bytes);
  OptimizerState state;
  state.scalars = parsed.at("scalars");
  for (const nlohmann::json& t : parsed.at("tensors")) {
    const auto& data = t.at("data").get_binary();
    std::vector<float> values(data.size() / sizeof(float));
    if (!values.empty()) std::memcpy(values.data(), data.data(), data.size());
    state.tensors.emplace_back(t.at("name").get<std::string>(),
                               Tensor::from_vector(values, t.at("shape").get<Shape>()));
  }
  return state;
}

// The index a buffer key "<buffer>.<index>" belongs to.
size_t buffer_index(const std::string& key) {
  return static_cast<size_t>(std::stoull(key.substr(key.rfind('.') + 1)));
}

}  // namespace

OptimizerShards::OptimizerShards(dist::Communicator& ranks, std::vector<Parameter> params,
                                 Optimizer& optimizer)
    : ranks_(ranks), params_(std::move(params)), optimizer_(optimizer) {
  MIXPREC_CHECK(optimizer.params().size() == params_.size(),
                "OptimizerShards: the optimizer has ", optimizer.params().size(),
                " parameters, the model ", params_.size());
  std::vector<int64_t> load(static_cast<size_t>(ranks.size()), 0);
  std::vector<bool> owned;
  for (const Parameter& p : params_) {
    int owner = 0;
    for (int r = 1; r < ranks.size(); ++r)
      if (load[static_cast<size_t>(r)] < load[static_cast<size_t>(owner)]) owner = r;
    load[static_cast<size_t>(owner)] += p.master().numel();
    owners_.push_back(owner);
    owned.push_back(owner == ranks.rank());
  }
  optimizer.set_owned(std::move(owned));
}

void OptimizerShards::share_masters() {
  NoGradGuard no_grad;
  const int me = ranks_.rank();
  std::vector<Tensor> mine;
  for (size_t i = 0; i < params_.size(); ++i)
    if (owners_[i] == me) mine.push_back(ops::reshape(params_[i].master().detach(), {-1}));
  const Tensor packed = mine.empty() ? Tensor::empty({0})
                        : mine.size() == 1 ? mine.front().clone()
                                           : ops::concat(mine, 0);
  const Tensor all = ranks_.all_gather(packed);  // every rank's owned masters, in rank order
  int64_t offset = 0;
  for (int r = 0; r < ranks_.size(); ++r) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owners_[i] != r) continue;
      Tensor master = params_[i].master();
      const int64_t n = master.numel();
      if (r != me) {
        master.copy_(ops::reshape(ops::slice(all, 0, offset, offset + n), master.shape()));
        params_[i].refresh_working();
      }
      offset += n;
    }
  }
}

OptimizerState OptimizerShards::gather_state() const {
  const OptimizerState local = optimizer_.state_dict();
  const std::vector<uint8_t> mine = to_bytes(local);
  std::vector<OptimizerState> by_rank;
  for (int r = 0; r < ranks_.size(); ++r) {
    // Every rank takes part in every broadcast; its own bytes go out in its turn.
    const std::vector<uint8_t> got = ranks_.broadcast_bytes(mine, r);
    by_rank.push_back(r == ranks_.rank() ? local : from_bytes(got));
  }
  OptimizerState whole;
  whole.scalars = local.scalars;
  const size_t n = params_.size();
  for (auto& [key, value] : whole.scalars.items()) {
    if (!value.is_array() || value.size() != n) continue;  // per-parameter lists: the owner's
    for (size_t i = 0; i < n; ++i)
      value[i] = by_rank[static_cast<size_t>(owners_[i])].scalars.at(key)[i];
  }
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [key, tensor] : by_rank[static_cast<size_t>(owners_[i])].tensors)
      if (buffer_index(key) == i) whole.tensors.emplace_back(key, tensor);
  }
  return whole;
}

int64_t optimizer_state_bytes(const Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, tensor] : optimizer.state_dict().tensors)
    bytes += tensor.numel() * static_cast<int64_t>(dtype_size(tensor.dtype()));
  return bytes;
}

}  // namespace mixprec
