// Checkpoint folders: what save leaves on disk, what list and load accept, what keep
// removes, and how they treat folders that a crash or a user left behind.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/checkpoint/checkpoint_dir.h"
#include "apps/checkpoint/safetensors.h"
#include "core/error.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using mixprec::DType;
using mixprec::Tensor;

class TempRun {
 public:
  TempRun() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("mixprec_checkpoint_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempRun() {
    std::error_code error;
    fs::remove_all(path_, error);
  }
  std::string run() const { return path_.string(); }
  std::string checkpoints() const { return (path_ / "checkpoints").string(); }

 private:
  fs::path path_;
};

// A checkpoint whose contents identify the step: w = [step, -step] and state {"step": step}.
mixprec::CheckpointData data_for(int64_t step) {
  mixprec::CheckpointData data;
  data.model = {{"w", Tensor::from_vector({float(step), -float(step)}, {2})},
                {"b", Tensor::from_vector({0.5f}, {}, DType::BF16)}};
  data.state = {{"step", step}, {"optimizer", {{"lr", 0.1}}}};
  return data;
}

std::vector<std::string> entries(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<int64_t> steps(const std::vector<std::pair<int64_t, std::string>>& list) {
  std::vector<int64_t> out;
  for (const auto& [step, path] : list) out.push_back(step);
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string load_error(const std::string& path) {
  try {
    mixprec::load_checkpoint(path);
  } catch (const mixprec::Error& e) {
    return e.what();
  }
  FAIL("loading '" << path << "' did not throw");
  return {};
}

}  // namespace

TEST_CASE("checkpoint dir: save writes step_N with both files and loads back",
          "[apps][checkpoint]") {
  TempRun run;
  const std::string saved = mixprec::save_checkpoint(run.checkpoints(), 40, data_for(40), 0);
  const fs::path expected = fs::path(run.checkpoints()) / "step_40";
  CHECK(fs::path(saved) == expected);
  CHECK(entries(run.checkpoints()) == std::vector<std::string>{"step_40"});
  CHECK(entries(saved) == std::vector<std::string>{"model.safetensors", "state.json"});

  // The files are what they claim: a safetensors file and pretty-printed JSON.
  const auto model = mixprec::read_safetensors((expected / "model.safetensors").string());
  CHECK(model.tensors.at("w").to_float_vector() == std::vector<float>{40.0f, -40.0f});
  std::ifstream state_in(expected / "state.json");
  const std::string state_text((std::istreambuf_iterator<char>(state_in)), {});
  CHECK(state_text.find("\n \"step\": 40") != std::string::npos);
  CHECK(nlohmann::json::parse(state_text) == data_for(40).state);

  // A checkpoint folder, the checkpoints folder and the run folder all load it.
  for (const std::string& path : {saved, run.checkpoints(), run.run()}) {
    INFO(path);
    const mixprec::LoadedCheckpoint loaded = mixprec::load_checkpoint(path);
    CHECK(fs::path(loaded.path) == expected);
    CHECK(loaded.state == data_for(40).state);
    REQUIRE(loaded.model.size() == 2);
    CHECK(loaded.model.at("w").to_float_vector() == std::vector<float>{40.0f, -40.0f});
    CHECK(loaded.model.at("b").dtype() == DType::BF16);
    CHECK(loaded.model.at("b").dim() == 0);
    CHECK(loaded.model.at("b").item() == 0.5);
  }
}

TEST_CASE("checkpoint dir: keep=2 after four saves leaves the newest two", "[apps][checkpoint]") {
  TempRun run;
  for (int64_t step : {10, 20, 30, 40}) {
    mixprec::save_checkpoint(run.checkpoints(), step, data_for(step), 2);
  }
  CHECK(entries(run.checkpoints()) == std::vector<std::string>{"step_30", "step_40"});
  const auto list = mixprec::list_checkpoints(run.checkpoints());
  CHECK(steps(list) == std::vector<int64_t>{30, 40});
  CHECK(fs::path(list[1].second) == fs::path(run.checkpoints()) / "step_40");
  const auto loaded = mixprec::load_checkpoint(run.run());
  CHECK(loaded.state["step"] == 40);
  CHECK(loaded.model.at("w").to_float_vector() == std::vector<float>{40.0f, -40.0f});
}

TEST_CASE("checkpoint dir: keep=0 keeps everything, and keep never removes the new one",
          "[apps][checkpoint]") {
  TempRun run;
  for (int64_t step : {1, 2, 3})
    mixprec::save_checkpoint(run.checkpoints(), step, data_for(step), 0);
  CHECK(steps(mixprec::list_checkpoints(run.checkpoints())) == std::vector<int64_t>{1, 2, 3});

  // Step 2 saved again with keep=1: the newest is step 3; step 1 goes, step 2 (just
  // written) stays.
  mixprec::save_checkpoint(run.checkpoints(), 2, data_for(2), 1);
  CHECK(steps(mixprec::list_checkpoints(run.checkpoints())) == std::vector<int64_t>{2, 3});
}

TEST_CASE("checkpoint dir: saving an existing step replaces it", "[apps][checkpoint]") {
  TempRun run;
  mixprec::save_checkpoint(run.checkpoints(), 5, data_for(5), 0);
  mixprec::CheckpointData other = data_for(5);
  other.model = {{"v", Tensor::from_ints({1, 2, 3}, {3})}};
  other.state["note"] = "second";
  mixprec::save_checkpoint(run.checkpoints(), 5, other, 0);

  // One folder, no leftovers of the swap.
  CHECK(entries(run.checkpoints()) == std::vector<std::string>{"step_5"});
  const auto loaded = mixprec::load_checkpoint(run.checkpoints());
  CHECK(loaded.state["note"] == "second");
  REQUIRE(loaded.model.size() == 1);
  CHECK(loaded.model.at("v").to_int_vector() == std::vector<int32_t>{1, 2, 3});
}

TEST_CASE("checkpoint dir: incomplete, hidden and foreign folders are ignored",
          "[apps][checkpoint]") {
  TempRun run;
  const fs::path dir = run.checkpoints();
  mixprec::save_checkpoint(dir.string(), 5, data_for(5), 0);
  mixprec::save_checkpoint(dir.string(), 6, data_for(6), 0);

  // A crashed save of step 9: complete files, but still under its temporary name.
  fs::create_directories(dir / ".step_9.tmp-123");
  fs::copy(dir / "step_6" / "model.safetensors", dir / ".step_9.tmp-123" / "model.safetensors");
  write_text(dir / ".step_9.tmp-123" / "state.json", R"({"step": 9})");
  // step_7 without state.json, step_8 without model.safetensors.
  fs::create_directories(dir / "step_7");
  fs::copy(dir / "step_6" / "model.safetensors", dir / "step_7" / "model.safetensors");
  fs::create_directories(dir / "step_8");
  write_text(dir / "step_8" / "state.json", R"({"step": 8})");
  // Names that are not step_<digits>, and a file named like a checkpoint.
  for (const char* name : {"step_", "step_x1", "step_1a", "Step_11", "step_-12", "best"}) {
    fs::create_directories(dir / name);
    fs::copy(dir / "step_6" / "model.safetensors", dir / name / "model.safetensors");
    write_text(dir / name / "state.json", "{}");
  }
  write_text(dir / "step_13", "not a folder");
  // A step number too large for int64.
  fs::create_directories(dir / "step_99999999999999999999");
  fs::copy(dir / "step_6" / "model.safetensors",
           dir / "step_99999999999999999999" / "model.safetensors");
  write_text(dir / "step_99999999999999999999" / "state.json", "{}");

  CHECK(steps(mixprec::list_checkpoints(dir.string())) == std::vector<int64_t>{5, 6});
  CHECK(mixprec::load_checkpoint(run.run()).state["step"] == 6);
  CHECK(mixprec::load_checkpoint(dir.string()).state["step"] == 6);

  // keep only counts complete checkpoints and leaves everything else alone.
  mixprec::save_checkpoint(dir.string(), 10, data_for(10), 1);
  CHECK(steps(mixprec::list_checkpoints(dir.string())) == std::vector<int64_t>{10});
  CHECK(fs::exists(dir / ".step_9.tmp-123"));
  CHECK(fs::exists(dir / "step_7"));
  CHECK(fs::exists(dir / "step_8"));
}

TEST_CASE("checkpoint dir: list of a missing folder is empty", "[apps][checkpoint]") {
  TempRun run;
  CHECK(mixprec::list_checkpoints(run.checkpoints()).empty());
  CHECK(mixprec::list_checkpoints(run.run() + "/nothing/here").empty());
}

TEST_CASE("checkpoint dir: steps sort as numbers, not as names", "[apps][checkpoint]") {
  TempRun run;
  for (int64_t step : {9, 100, 10})
    mixprec::save_checkpoint(run.checkpoints(), step, data_for(step), 0);
  CHECK(steps(mixprec::list_checkpoints(run.checkpoints())) == std::vector<int64_t>{9, 10, 100});
  CHECK(mixprec::load_checkpoint(run.run()).state["step"] == 100);
}

TEST_CASE("checkpoint dir: load errors name the path", "[apps][checkpoint]") {
  TempRun run;
  SECTION("a run without checkpoints") {
    CHECK_THAT(load_error(run.run()), Contains("no checkpoint found in '" + run.run() + "'"));
    fs::create_directories(run.checkpoints());
    CHECK_THAT(load_error(run.run()), Contains("no checkpoint found in '" + run.run() + "'"));
  }
  SECTION("a path that does not exist") {
    const std::string path = run.run() + "/missing";
    CHECK_THAT(load_error(path), Contains("no checkpoint found in '" + path + "'"));
  }
  SECTION("only incomplete checkpoints") {
    fs::create_directories(fs::path(run.checkpoints()) / "step_3");
    write_text(fs::path(run.checkpoints()) / "step_3" / "state.json", "{}");
    CHECK_THAT(load_error(run.run()), Contains("no checkpoint found"));
  }
  SECTION("state.json that is not JSON") {
    const std::string saved = mixprec::save_checkpoint(run.checkpoints(), 1, data_for(1), 0);
    write_text(fs::path(saved) / "state.json", "{\"step\": ");
    CHECK_THAT(load_error(run.run()),
               Contains((fs::path(saved) / "state.json").string()) && Contains("not valid JSON"));
  }
  SECTION("a step folder without state.json") {
    const std::string saved = mixprec::save_checkpoint(run.checkpoints(), 1, data_for(1), 0);
    fs::remove(fs::path(saved) / "state.json");
    CHECK_THAT(load_error(saved), Contains((fs::path(saved) / "state.json").string()));
  }
  SECTION("a corrupt model.safetensors") {
    const std::string saved = mixprec::save_checkpoint(run.checkpoints(), 1, data_for(1), 0);
    const fs::path model = fs::path(saved) / "model.safetensors";
    fs::resize_file(model, fs::file_size(model) - 1);
    CHECK_THAT(load_error(run.run()), Contains(model.string()));
  }
}

TEST_CASE("checkpoint dir: save errors are mixprec errors naming the path", "[apps][checkpoint]") {
  TempRun run;
  SECTION("checkpoints path is a file") {
    write_text(run.checkpoints(), "x");
    CHECK_THROWS_AS(mixprec::save_checkpoint(run.checkpoints(), 1, data_for(1), 0), mixprec::Error);
    CHECK_THROWS_WITH(mixprec::save_checkpoint(run.checkpoints(), 1, data_for(1), 0),
                      Contains(run.checkpoints()));
  }
  SECTION("a negative step") {
    CHECK_THROWS_AS(mixprec::save_checkpoint(run.checkpoints(), -1, data_for(1), 0),
                    mixprec::Error);
  }
  SECTION("a model that cannot be written leaves no temporary folder") {
    mixprec::save_checkpoint(run.checkpoints(), 1, data_for(1), 0);
    mixprec::CheckpointData bad = data_for(2);
    bad.model.push_back({"w", Tensor::zeros({1})});  // duplicate name
    CHECK_THROWS_WITH(mixprec::save_checkpoint(run.checkpoints(), 2, bad, 0), Contains("twice"));
    CHECK(entries(run.checkpoints()) == std::vector<std::string>{"step_1"});
  }
  SECTION("a state that is not UTF-8 leaves the old checkpoint in place") {
    mixprec::save_checkpoint(run.checkpoints(), 1, data_for(1), 0);
    mixprec::CheckpointData bad = data_for(1);
    bad.state["name"] = "bad\xff";
    CHECK_THROWS_AS(mixprec::save_checkpoint(run.checkpoints(), 1, bad, 0), mixprec::Error);
    CHECK(entries(run.checkpoints()) == std::vector<std::string>{"step_1"});
    CHECK(mixprec::load_checkpoint(run.run()).state == data_for(1).state);
  }
}
