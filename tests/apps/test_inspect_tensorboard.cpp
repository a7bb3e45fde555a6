// `mixprec inspect`'s TensorBoard histograms: the log2 buckets of a GradHistogram worked out
// by hand, and a real report's event file read back with TensorBoard's reader against
// inspect.json's counts.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "apps/inspect/inspect.h"
#include "apps/inspect/tensorboard_histograms.h"
#include "tensorboard_reader.h"
#include "train_test_support.h"

using namespace mixprec;
using namespace mixprec::inspect;
using namespace train_test;

TEST_CASE("inspect: a gradient histogram becomes log2 buckets with bin upper edges",
          "[inspect][tensorboard]") {
  GradHistogram h = make_grad_histogram(1.0);
  // log2: 0.5 and 0.75 in bin -1, 3 in bin 1; zeros are left out.
  const std::vector<float> values = {0.0f, 0.5f, -0.75f, 3.0f, -0.0f};
  add_values(h, values);
  const std::optional<tensorboard::Histogram> t = log2_histogram(h);
  REQUIRE(t);
  CHECK(t->limits == std::vector<double>{0, 1, 2});  // bins -1, 0 (empty), 1
  CHECK(t->counts == std::vector<double>{2, 0, 1});
  CHECK(t->min == -1);
  CHECK(t->max == 2);
  CHECK(t->num == 3);
  CHECK(t->sum == 2 * -0.5 + 1.5);
  CHECK(t->sum_squares == 2 * 0.25 + 1.5 * 1.5);

  // Below 2^-40 and non-finite: the edge buckets (-41, -40] and (20, 21].
  GradHistogram edges = make_grad_histogram(1.0);
  const std::vector<float> extreme = {1e-13f, std::numeric_limits<float>::infinity()};
  add_values(edges, extreme);
  const std::optional<tensorboard::Histogram> e = log2_histogram(edges);
  REQUIRE(e);
  CHECK(e->min == -41);
  CHECK(e->max == 21);
  REQUIRE(e->limits.size() == 62);
  CHECK(e->limits.front() == -40);
  CHECK(e->limits.back() == 21);
  CHECK(e->counts.front() == 1);
  CHECK(e->counts.back() == 1);
  CHECK(e->num == 2);

  GradHistogram zeros = make_grad_histogram(1.0);
  const std::vector<float> nothing = {0.0f, -0.0f};
  add_values(zeros, nothing);
  CHECK_FALSE(log2_histogram(zeros));
}

TEST_CASE("inspect: TensorBoard's reader finds inspect.json's histograms", "[inspect][tensorboard]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  if (!mixprec_test::tensorboard_available()) return;
  ScratchDir dir("inspect-tensorboard");
  InspectOptions options;
  options.config_path = config_path("cnn_fashion.yaml");
  options.overrides = {"precision=fp16",
                       "model.layers=[{conv: 4, kernel: 3, padding: 1}, batchnorm, relu, "
                       "{maxpool: 2}, flatten, {linear: 10}]",
                       "train.epochs=0", "train.steps=20", "train.batch_size=16",
                       "data.limit_train=256", "data.limit_test=32", "device=cpu"};
  options.out_dir = dir / "report";
  options.steps = 2;
  std::ostringstream log;
  const nlohmann::json report = run_inspect(options, log);
  const nlohmann::json read = mixprec_test::read_tensorboard(options.out_dir, dir / "reader");
  REQUIRE(read["files"].size() == 1);
  CHECK(read["files"][0]["end"] == "clean");
  CHECK(read["files"][0]["records"] == 2);  // the version and one Event of histograms

  std::set<std::string> expected_tags;
  const auto check = [&](const nlohmann::json& entry, const std::string& tag) {
    INFO(tag);
    const int64_t nonzero = entry["elements"].get<int64_t>() - entry["zeros"].get<int64_t>();
    if (nonzero == 0) return;
    expected_tags.insert(tag);
    REQUIRE(read["histograms"].contains(tag));
    REQUIRE(read["histograms"][tag].size() == 1);
    const nlohmann::json& h = read["histograms"][tag][0];
    CHECK(h["step"] == 2);
    CHECK(h["num"].get<double>() == static_cast<double>(nonzero));
    // Each log2 bin of inspect.json is the bucket with upper edge k + 1.
    std::map<double, double> buckets;
    for (size_t i = 0; i < h["bucket_limit"].size(); ++i)
      buckets[h["bucket_limit"][i].get<double>()] = h["bucket"][i].get<double>();
    double total = 0;
    for (const nlohmann::json& bin : entry["bins"]) {
      const double count = bin["count"].get<double>();
      const double limit = bin["log2"].get<double>() + 1;
      total += count;
      if (count > 0) CHECK(buckets[limit] == count);
      if (buckets.count(limit)) CHECK(buckets[limit] == count);
    }
    CHECK(total + entry["underflow_bin"].get<double>() + entry["overflow_bin"].get<double>() ==
          h["num"].get<double>());
  };
  for (const nlohmann::json& layer : report["activations"])
    check(layer, "grad_log2/activation/" + layer["layer"].get<std::string>());
  for (const nlohmann::json& weight : report["weights"])
    check(weight, "grad_log2/weight/" + weight["tensor"].get<std::string>());
  CHECK(expected_tags.size() >= 10);  // 6 layers, 6 tensors, all with non-zero gradients
  std::set<std::string> tags;
  for (const auto& [tag, ignored] : read["histograms"].items()) tags.insert(tag);
  CHECK(tags == expected_tags);
  CHECK(read["scalars"].empty());

  // log.tensorboard false: the report without the event file.
  options.out_dir = dir / "without";
  options.overrides.push_back("log.tensorboard=false");
  run_inspect(options, log);
  CHECK(fs::exists(options.out_dir + "/inspect.json"));
  for (const auto& entry : fs::directory_iterator(options.out_dir))
    CHECK(entry.path().filename().string().find("tfevents") == std::string::npos);
}
