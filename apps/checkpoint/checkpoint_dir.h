// The checkpoints of a run: <run>/checkpoints/step_<N>/{model.safetensors, state.json}.
//
// A checkpoint is written into a hidden temporary folder (".step_<N>.tmp-<pid>") whose files
// are fsynced, and then renamed to step_<N>, and the parent folder fsynced: a checkpoint
// folder either exists complete or not at all. An existing step_<N> is swapped with the new
// one in one rename (RENAME_EXCHANGE) and then removed under its hidden name. Only after the
// new checkpoint is in place are older ones removed (keep), each first renamed to a hidden
// name (".step_<N>.del-<pid>") so that it disappears at once rather than file by file.
// A reader ignores anything that is not step_<digits> with both files present, so a process
// killed at any moment of a save (SIGKILL, power loss) leaves the checkpoints complete before
// it, or those plus the new one, and at most hidden ".step_*" folders, which
// remove_unfinished_saves clears (`mixprec train --resume` calls it).
//
// Test hook: when the environment variable MIXPREC_TEST_SAVE_DELAY_MS holds a whole number
// of milliseconds, save_checkpoint sleeps that long at each stage boundary: after
// model.safetensors is written, after state.json is written (just before the rename), and
// after the rename (before the replaced and the older checkpoints are removed). The tests
// use it to stop a save in each of its stages; it changes nothing else.
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
// existing step_<step> is replaced in one rename (see above; on a file system without
// RENAME_EXCHANGE, by two renames, between which a crash leaves it under ".step_<N>.old-*"
// for remove_unfinished_saves to put back). With keep > 0, afterwards removes the oldest
// complete checkpoints beyond the newest `keep`; the new one is never among them.
std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step,
                            const CheckpointData& data, int64_t keep);

// <checkpoints_dir>/step_<step>: where save_checkpoint puts that step.
std::string checkpoint_folder(const std::string& checkpoints_dir, int64_t step);

// Clears what killed saves left under `checkpoints_dir`: the hidden ".step_<N>.tmp-<pid>",
// ".step_<N>.old-<pid>" and ".step_<N>.del-<pid>" folders of processes that no longer run
// (or of this one, which is not saving while it calls this). A ".old" folder is the
// step_<N> that a save was replacing on a file system without RENAME_EXCHANGE; when the
// save died before the new step_<N> took its place, it is renamed back instead. Returns
// how many folders were removed or put back; nothing else is touched, and a missing folder
// is not an error. Throws mixprec::Error naming the folder when one cannot be removed.
int remove_unfinished_saves(const std::string& checkpoints_dir);

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
