// The event files of real runs, read back with TensorBoard's own reader
// (scripts/read_tensorboard.py): every logged value of metrics.jsonl under its documented tag
// and step, valid checksums, a resumed run that TensorBoard shows as one curve, and a killed
// run's file readable up to its last flush.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "tensorboard_reader.h"
#include "train_test_support.h"

extern char** environ;

using namespace train_test;
using mixprec_test::read_tensorboard;
using mixprec_test::tensorboard_available;

namespace {

// The documented tags (apps/tensorboard/metrics_events.h), spelled out here so that a wrong
// key or tag in the writer fails.
const std::vector<std::tuple<std::string, std::string, std::string>> kTags = {
    {"step", "train_loss", "loss/train"},    {"step", "lr", "optim/lr"},
    {"step", "grad_norm", "optim/grad_norm"}, {"step", "scale", "amp/scale"},
    {"step", "skipped_steps", "amp/skipped"}, {"step", "step_ms", "perf/step_ms"},
    {"step", "samples_per_s", "perf/samples_per_s"}, {"eval", "val_loss", "loss/val"},
    {"eval", "val_accuracy", "accuracy/val"}};

using Points = std::vector<std::pair<int64_t, float>>;

// {tag: points} of the records' finite numbers, in record order, as floats.
std::map<std::string, Points> expected_points(const std::vector<nlohmann::json>& records) {
  std::map<std::string, Points> points;
  for (const nlohmann::json& record : records) {
    for (const auto& [event, key, tag] : kTags) {
      if (record.value("event", "") != event || !record.contains(key)) continue;
      const nlohmann::json& value = record[key];
      if (!value.is_number() || !std::isfinite(value.get<double>())) continue;
      points[tag].emplace_back(record["step"].get<int64_t>(),
                               static_cast<float>(value.get<double>()));
    }
  }
  return points;
}

// The reader's {tag: [[step, value], ...]} as points.
std::map<std::string, Points> read_points(const nlohmann::json& scalars) {
  std::map<std::string, Points> points;
  for (const auto& [tag, list] : scalars.items()) {
    for (const nlohmann::json& point : list)
      points[tag].emplace_back(point[0].get<int64_t>(),
                               static_cast<float>(point[1].get<double>()));
  }
  return points;
}

// The records of the complete lines of a metrics.jsonl that a killed run may have left with
// its last line cut short.
std::vector<nlohmann::json> complete_records(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::istringstream text(read_text(path));
  for (std::string line; std::getline(text, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded()) records.push_back(record);
  }
  return records;
}

std::vector<std::string> event_files(const std::string& run) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(run)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A 6-layer fp16 CNN on a few hundred Fashion-MNIST images, clipped (so the grad norm is
// logged), with an overflow injected at step 3 (a skipped step), checkpoints every 4 steps.
std::vector<std::string> tiny_cnn_args(const std::string& out, int steps,
                                       std::vector<std::string> extra = {}) {
  std::vector<std::string> args = train_args(
      config_path("cnn_fashion.yaml"), out,
      mixprec_test::as_set_args(
          {"precision=fp16",
           "model.layers=[{conv: 4, kernel: 3, padding: 1}, batchnorm, relu, {maxpool: 2}, "
           "flatten, {linear: 10}]",
           "train.epochs=0", "train.steps=" + std::to_string(steps), "train.batch_size=16",
           "train.clip_grad_norm=1.0", "train.eval_every=4", "data.limit_train=256",
           "data.limit_test=32", "checkpoint.every=4", "checkpoint.keep=0", "device=cpu",
           "debug.inject_nonfinite={step: 3, tensor: 0.weight, value: inf}"}));
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Whether Fashion-MNIST is installed; when not, warns that the calling test is skipped.
bool data_available() {
  if (fashion_mnist_installed()) return true;
  WARN("Fashion-MNIST is not installed; skipped");
  return false;
}

}  // namespace

TEST_CASE("tensorboard run: TensorBoard's reader finds every logged value under its tag",
          "[apps][tensorboard]") {
  if (!data_available() || !tensorboard_available()) return;
  ScratchDir dir("tensorboard-run");
  const std::string run = dir / "run";
  require_ok(run_cli(tiny_cnn_args(run, 8, {"--set", "train.log_every=2"})));

  const std::vector<nlohmann::json> records = read_jsonl(run + "/metrics.jsonl");
  const nlohmann::json read = read_tensorboard(run, dir / "reader");
  REQUIRE(read["files"].size() == 1);
  const nlohmann::json& file = read["files"][0];
  CHECK(file["name"] == event_files(run).at(0));
  CHECK(file["end"] == "clean");  // every length and data CRC valid, no bytes left over
  CHECK(file["file_version"] == "brain.Event:2");
  CHECK(file["session_starts"] == nlohmann::json::array({1}));

  const std::map<std::string, Points> expected = expected_points(records);
  // Steps 1, 2, 3 (skipped), 4, 6 and 8 logged; evaluations at 4 and 8.
  CHECK(expected.at("loss/train").size() == 6);
  CHECK(expected.at("loss/val") == Points{{4, expected.at("loss/val")[0].second},
                                          {8, expected.at("loss/val")[1].second}});
  CHECK(expected.at("amp/skipped").back() == std::pair<int64_t, float>{8, 1.0f});
  CHECK(expected.size() == kTags.size());  // each tag has points in this run
  CHECK(read_points(file["scalars"]) == expected);
  // The view over the folder is the same (a single session purges nothing).
  CHECK(read_points(read["scalars"]) == expected);
  // One record per logged step and evaluation, plus the version and the START.
  CHECK(file["records"] == 2 + 6 + 2);
}

TEST_CASE("tensorboard run: log.tensorboard false writes no event file", "[apps][tensorboard]") {
  if (!data_available()) return;
  ScratchDir dir("tensorboard-off");
  const std::string run = dir / "run";
  require_ok(run_cli(tiny_cnn_args(
      run, 2, {"--set", "log.tensorboard=false", "--set", "debug.inject_nonfinite={}"})));
  CHECK(fs::exists(run + "/metrics.jsonl"));
  CHECK(event_files(run).empty());
}

TEST_CASE("tensorboard run: a resumed run adds a file and TensorBoard shows one curve",
          "[apps][tensorboard]") {
  if (!data_available() || !tensorboard_available()) return;
  ScratchDir dir("tensorboard-resume");
  const std::string run = dir / "run";
  const std::vector<std::string> args = tiny_cnn_args(run, 8, {"--set", "train.log_every=1"});
  require_ok(run_cli(args));
  // As a crash after step 8 was logged but before it was saved leaves the run: its newest
  // checkpoint is step 4, and the event file holds steps 5 to 8 that the resumed run takes
  // again.
  fs::remove_all(checkpoint_file(run, 8, ""));
  fs::remove(run + "/summary.json");
  // Logging every 3 steps now: the resumed run logs 6 and 8, so the earlier file's 5 and 7
  // show unless TensorBoard drops them.
  std::vector<std::string> resume = as_resume(args);
  resume.insert(resume.end(), {"--set", "train.log_every=3"});
  require_ok(run_cli(resume));

  const std::vector<std::string> names = event_files(run);
  REQUIRE(names.size() == 2);
  const nlohmann::json read = read_tensorboard(run, dir / "reader", true);
  REQUIRE(read["files"].size() == 2);
  CHECK(read["files"][0]["name"] == names[0]);  // the first session's file is read first
  CHECK(read["files"][1]["name"] == names[1]);
  for (const nlohmann::json& file : read["files"]) CHECK(file["end"] == "clean");
  CHECK(read["files"][0]["session_starts"] == nlohmann::json::array({1}));
  // The last kept points of every tag are at step 4 (the checkpoint's log step and
  // evaluation): START there, step 4's records again, then the resumed run's 6 and 8.
  CHECK(read["files"][1]["session_starts"] == nlohmann::json::array({4}));
  std::vector<int64_t> first_steps, second_steps;
  for (const auto& point : read["files"][0]["scalars"]["loss/train"]) first_steps.push_back(point[0]);
  for (const auto& point : read["files"][1]["scalars"]["loss/train"]) second_steps.push_back(point[0]);
  CHECK(first_steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(second_steps == std::vector<int64_t>{4, 6, 8});

  // metrics.jsonl dropped the lines after step 4 and has the resumed run's; both of
  // TensorBoard's loaders show exactly that: the Python one (EventAccumulator) and the data
  // server a running TensorBoard serves by default.
  CHECK(logged_steps(run) == std::vector<int64_t>{1, 2, 3, 4, 6, 8});
  const std::map<std::string, Points> expected = expected_points(read_jsonl(run + "/metrics.jsonl"));
  CHECK(expected.at("loss/val").size() == 2);  // at 4 (first session) and 8 (second)
  CHECK(read_points(read["scalars"]) == expected);
  if (read["served"].is_null()) {
    WARN("TensorBoard's data server did not start here; its view is not checked");
  } else {
    CHECK(read_points(read["served"]) == expected);
  }
}

TEST_CASE("tensorboard run: a killed run's file reads up to its last flush, a cut one up to "
          "its last whole record", "[apps][tensorboard]") {
  if (!data_available() || !tensorboard_available()) return;
  const fs::path program = mixprec_binary();
  REQUIRE(fs::exists(program));
  ScratchDir dir("tensorboard-kill");
  const std::string run = dir / "run";
  std::vector<std::string> args =
      tiny_cnn_args(run, 100000, {"--set", "train.log_every=1", "--set", "checkpoint.every=0"});
  args.insert(args.begin(), program.string());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, (dir / "stderr").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&actions);
  // Killed once a few steps are logged (7 lines: steps 1 to 6 and the evaluation at 4), at
  // whatever point of a step it is in.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline &&
         complete_records(run + "/metrics.jsonl").size() < 7)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(::kill(pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("stderr: " << read_text(dir / "stderr"));
  REQUIRE(WIFSIGNALED(status));

  const nlohmann::json read = read_tensorboard(run, dir / "reader");
  REQUIRE(read["files"].size() == 1);
  CHECK(read["files"][0]["end"] != "crc");  // clean, or cut inside the record being written
  // Each metrics.jsonl line is written before its record here, so the file holds every
  // line's record but at most the last one's, with metrics.jsonl's values: one record per
  // line after the version and the START.
  std::vector<nlohmann::json> records = complete_records(run + "/metrics.jsonl");
  const auto summaries = static_cast<size_t>(read["files"][0]["records"].get<int64_t>() - 2);
  CHECK(summaries >= 6);
  CHECK(summaries + 1 >= records.size());
  REQUIRE(summaries <= records.size());
  records.resize(summaries);
  CHECK(read_points(read["files"][0]["scalars"]) == expected_points(records));

  // The same file cut inside its last record: the reader stops before that record and keeps
  // every one before it.
  const std::string cut_dir = dir / "cut";
  fs::create_directories(cut_dir);
  const std::string name = event_files(run).at(0);
  const std::string bytes = read_text(run + "/" + name);
  write_text(cut_dir + "/" + name, bytes.substr(0, bytes.size() - 5));
  const nlohmann::json cut = read_tensorboard(cut_dir, dir / "cut-reader");
  const int64_t whole = read["files"][0]["records"].get<int64_t>();
  CHECK(cut["files"][0]["end"] == "truncated");
  CHECK(cut["files"][0]["records"] == (read["files"][0]["end"] == "clean" ? whole - 1 : whole));
  const std::map<std::string, Points> cut_points = read_points(cut["scalars"]);
  std::vector<nlohmann::json> fewer = records;
  if (read["files"][0]["end"] == "clean") fewer.pop_back();
  CHECK(cut_points == expected_points(fewer));
}
