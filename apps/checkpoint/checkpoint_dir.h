// The checkpoints of a run: <run>/checkpoints/step_<N>/{model.safetensors, state.json}.
//
// A checkpoint is written into a hidden temporary folder (".step_<N>.tmp-<pid>") whose files
// are fsynced, and then renamed to step_<N>, and the parent folder fsynced: a checkpoint
// folder either exists complete or not at all. Only after that are older ones removed (keep).
// A reader ignores anything that is not step_<digits> with both files present.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace mixprec {

struct CheckpointData {
  std::vector<std::pair<std::string, Tensor>> model;  // model.safetensors, in order
  nlohmann::json state;                               // state.json
};

// Writes step_<step> under `checkpoints_dir` (created if needed) and returns its path. An
// existing step_<step> is replaced (through the same rename). With keep > 0, afterwards
// removes the oldest complete checkpoints beyond the newest `keep`.
std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step,
                            const CheckpointData& data, int64_t keep);

// Complete checkpoints under `checkpoints_dir`, sorted by step (ascending); empty when the
// folder does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& checkpoints_dir);

// Reads a checkpoint folder (step_<N>) or a run folder (its newest checkpoint). Throws
// mixprec::Error naming the path: no checkpoint there, unreadable or malformed
// model.safetensors (see read_safetensors), state.json that is not JSON.
struct LoadedCheckpoint {
  std::string path;  // the step_<N> folder read
  std::map<std::string, Tensor> model;
  nlohmann::json state;
};
LoadedCheckpoint load_checkpoint(const std::string& path);

}  // namespace mixprec
