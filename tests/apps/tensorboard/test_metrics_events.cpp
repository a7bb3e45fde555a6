// metrics.jsonl records as TensorBoard scalars: the documented tags, the values a chart can
// draw, and the START record a resumed run's file begins with.
#include <catch2/catch.hpp>

#include <filesystem>
#include <limits>
#include <map>

#include "apps/tensorboard/metrics_events.h"
#include "tests/apps/tensorboard/event_records.h"
#include "tests/scratch_dir.h"

using namespace mixprec::tensorboard;
using namespace tensorboard_test;
using mixprec_test::ScratchDir;

namespace {

std::map<std::string, double> as_map(const std::vector<Scalar>& scalars) {
  std::map<std::string, double> map;
  for (const Scalar& s : scalars) map[s.tag] = s.value;
  return map;
}

}  // namespace

TEST_CASE("tensorboard: a step record's scalars carry its values under the documented tags",
          "[tensorboard]") {
  const nlohmann::json step = {
      {"event", "step"},         {"step", 40},          {"loss", 2.0},
      {"train_loss", 2.25},      {"lr", 0.001},         {"grad_norm", 0.75},
      {"scale", 32768.0},        {"next_scale", 65536}, {"skipped", false},
      {"skipped_steps", 3},      {"step_ms", 12.5},     {"samples_per_s", 5120.0},
      {"host_syncs_per_step", 1.5}, {"epoch", 0},       {"reason", ""}};
  const std::vector<Scalar> scalars = metrics_scalars(step);
  std::vector<std::string> tags;
  for (const Scalar& s : scalars) tags.push_back(s.tag);
  CHECK(tags == std::vector<std::string>{"loss/train", "optim/lr", "optim/grad_norm",
                                         "amp/scale", "amp/skipped", "perf/step_ms",
                                         "perf/samples_per_s", "perf/host_syncs_per_step"});
  const auto values = as_map(scalars);
  CHECK(values.at("loss/train") == 2.25);
  CHECK(values.at("optim/lr") == 0.001);
  CHECK(values.at("optim/grad_norm") == 0.75);
  CHECK(values.at("amp/scale") == 32768.0);
  CHECK(values.at("amp/skipped") == 3.0);
  CHECK(values.at("perf/step_ms") == 12.5);
  CHECK(values.at("perf/samples_per_s") == 5120.0);
  CHECK(values.at("perf/host_syncs_per_step") == 1.5);

  // A GPT's throughput is in tokens.
  CHECK(as_map(metrics_scalars({{"event", "step"}, {"step", 1}, {"tokens_per_s", 9.0}}))
            .at("perf/tokens_per_s") == 9.0);
}

TEST_CASE("tensorboard: values a chart cannot draw are left out", "[tensorboard]") {
  // A skipped step: the loss window empty (null), grad_norm not recorded (null), a scale
  // written as text because it overflowed.
  const nlohmann::json skipped = {{"event", "step"},       {"step", 7},
                                  {"train_loss", nullptr}, {"grad_norm", nullptr},
                                  {"scale", "inf"},        {"lr", 0.5},
                                  {"skipped_steps", 1}};
  const auto values = as_map(metrics_scalars(skipped));
  CHECK(values.size() == 2);
  CHECK(values.at("optim/lr") == 0.5);
  CHECK(values.at("amp/skipped") == 1.0);
  CHECK(metrics_scalars({{"event", "step"}, {"lr", std::numeric_limits<double>::infinity()}})
            .empty());
  CHECK(metrics_scalars({{"event", "stopped"}, {"step", 9}, {"scale", 1.0}}).empty());
  CHECK(metrics_scalars({{"step", 9}, {"lr", 1.0}}).empty());  // no event
}

TEST_CASE("tensorboard: an eval record writes loss/val and accuracy/val", "[tensorboard]") {
  const auto values = as_map(metrics_scalars(
      {{"event", "eval"}, {"step", 100}, {"val_loss", 0.5}, {"val_accuracy", 0.875}}));
  CHECK(values.size() == 2);
  CHECK(values.at("loss/val") == 0.5);
  CHECK(values.at("accuracy/val") == 0.875);
  // A GPT has no accuracy.
  CHECK(metrics_scalars({{"event", "eval"}, {"step", 100}, {"val_loss", 1.5}}).size() == 1);
}

TEST_CASE("tensorboard: a fresh run's log starts with START at step 1 and writes each record "
          "at its step", "[tensorboard]") {
  ScratchDir dir("tensorboard-metrics");
  std::string path;
  {
    MetricsEventLog log(dir / "run");
    path = log.path();
    log.write({{"event", "step"}, {"step", 1}, {"lr", 0.25}, {"train_loss", 1.5}});
    log.write({{"event", "eval"}, {"step", 30}, {"val_loss", 1.25}});
    log.write({{"event", "stopped"}, {"step", 31}});
  }
  const Records records = split_records(read_bytes(path));
  CHECK(records.crc_ok);
  CHECK(records.clean_end);
  const std::vector<Event> events = parse_events(records);
  REQUIRE(events.size() == 4);  // version, START, step 1, eval 30; the stopped record writes none
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[1].session_log().status() == SessionLog::START);
  CHECK(events[1].step() == 1);
  CHECK(events[2].step() == 1);
  REQUIRE(events[2].summary().value_size() == 2);
  CHECK(events[2].summary().value(0).tag() == "loss/train");
  CHECK(events[2].summary().value(0).simple_value() == 1.5f);
  CHECK(events[2].summary().value(1).tag() == "optim/lr");
  CHECK(events[3].step() == 30);
  CHECK(events[3].summary().value(0).tag() == "loss/val");
  CHECK(events[3].summary().value(0).simple_value() == 1.25f);
}

TEST_CASE("tensorboard: a resumed run's log starts at the earliest last kept point and writes "
          "the kept records from there again", "[tensorboard]") {
  ScratchDir dir("tensorboard-resumed");
  // Resumed from step 20: steps logged every 5 (and a skipped step at 17), evaluated every 8.
  const std::vector<nlohmann::json> kept = {
      {{"event", "step"}, {"step", 5}, {"lr", 0.5}},
      {{"event", "eval"}, {"step", 8}, {"val_loss", 2.0}},
      {{"event", "step"}, {"step", 10}, {"lr", 0.4}},
      {{"event", "step"}, {"step", 15}, {"lr", 0.3}},
      {{"event", "eval"}, {"step", 16}, {"val_loss", 1.75}},
      {{"event", "step"}, {"step", 17}, {"lr", 0.3}, {"train_loss", nullptr}},
      {{"event", "step"}, {"step", 20}, {"lr", 0.2}, {"train_loss", 1.5}}};
  std::string path;
  {
    MetricsEventLog log(dir / "run", 21, kept);
    path = log.path();
  }
  const std::vector<Event> events = parse_events(split_records(read_bytes(path)));
  // loss/val's last kept point is at 16, the earliest of the tags' last points: START at 16,
  // then the records of steps 16, 17 and 20 again.
  REQUIRE(events.size() == 5);
  CHECK(events[1].session_log().status() == SessionLog::START);
  CHECK(events[1].step() == 16);
  CHECK(events[2].step() == 16);
  CHECK(events[2].summary().value(0).tag() == "loss/val");
  CHECK(events[2].summary().value(0).simple_value() == 1.75f);
  CHECK(events[3].step() == 17);
  CHECK(events[3].summary().value_size() == 1);  // lr; the null loss writes nothing
  CHECK(events[4].step() == 20);
  CHECK(events[4].summary().value_size() == 2);

  // Nothing kept (resumed from step 0): START at the first step, nothing written again.
  {
    MetricsEventLog log(dir / "empty", 1, {});
    path = log.path();
  }
  const std::vector<Event> empty = parse_events(split_records(read_bytes(path)));
  REQUIRE(empty.size() == 2);
  CHECK(empty[1].session_log().status() == SessionLog::START);
  CHECK(empty[1].step() == 1);
}
