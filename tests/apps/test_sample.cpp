// `mixprec sample`: nanoGPT's token choice (temperature, top-k, a seeded draw), the command's
// text, its determinism, the cache against the full forward, and its bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "apps/sample/token_choice.h"
#include "core/tensor.h"
#include "tests/apps/train_test_support.h"

using namespace train_test;
using Catch::Contains;
using mixprec::choose_token;
using mixprec::TokenChoice;

namespace {

// How often each id is chosen over `draws` uniform numbers spread evenly over [0, 1).
std::map<int32_t, int> choices(const std::vector<float>& logits, const TokenChoice& choice,
                               int draws = 1000) {
  std::map<int32_t, int> count;
  for (int i = 0; i < draws; ++i) ++count[choose_token(logits, choice, (i + 0.5) / draws)];
  return count;
}

// A GPT trained for a few steps on tiny shakespeare (1 layer, 32 wide, block 16), in `dir`.
struct TinyGpt {
  std::string config = config_path("gpt_shakespeare.yaml");
  std::vector<std::string> sets;
  std::string run;

  explicit TinyGpt(const ScratchDir& dir) : run(dir / "run") {
    for (const std::string& o : mixprec_test::small_gpt_overrides(shakespeare_path()))
      sets.insert(sets.end(), {"--set", o});
    std::vector<std::string> args = train_args(config, run, sets);
    args.insert(args.end(), {"--set", "train.steps=3"});
    require_ok(run_cli(args));
  }

  // `mixprec sample CONFIG --checkpoint RUN` with the tiny model's settings, then `extra`.
  CliResult sample(std::vector<std::string> extra) const {
    std::vector<std::string> args{"sample", config, "--checkpoint", run};
    args.insert(args.end(), sets.begin(), sets.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }
};

void expect_bad_input(const CliResult& r, const std::string& message) {
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Contains(message));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("token choice follows the softmax of the logits over the temperature",
          "[apps][sample]") {
  // Weights e^0 : e^-ln3 = 3 : 1 at temperature 1, 9 : 1 at temperature 0.5.
  const std::vector<float> logits{0.0f, -std::log(3.0f)};
  auto warm = choices(logits, {1.0, 200});
  CHECK(warm[0] == 750);
  CHECK(warm[1] == 250);
  auto cool = choices(logits, {0.5, 200});
  CHECK(cool[0] == 900);
  CHECK(cool[1] == 100);
  // The same u picks the same id: the draw is a pure function.
  CHECK(choose_token(logits, {1.0, 200}, 0.7499) == 0);
  CHECK(choose_token(logits, {1.0, 200}, 0.7501) == 1);
}

TEST_CASE("top-k keeps the k largest logits and their ties", "[apps][sample]") {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  for (const auto& [id, n] : choices(logits, {1.0, 1})) CHECK((id == 1 || id == 3));
  auto two = choices(logits, {1.0, 3});
  CHECK(two.count(0) == 0);
  CHECK(two.count(4) == 0);
  CHECK(two.at(2) > 0);
  // A k above the row keeps everything, as nanoGPT's min(top_k, vocab).
  CHECK(choices(logits, {1.0, 200}).size() == 5);
  // -inf never wins.
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(choices({-inf, 0.0f, -inf}, {1.0, 200}) == std::map<int32_t, int>{{1, 1000}});
}

TEST_CASE("token choice refuses NaN logits and bad settings", "[apps][sample]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(choose_token(std::vector<float>{0.0f, nan}, {}, 0.5),
                    Contains("logit for token 1 is nan"));
  CHECK_THROWS_WITH(choose_token(std::vector<float>{0.0f}, {0.0, 1}, 0.5),
                    Contains("temperature must be a number > 0"));
  CHECK_THROWS_WITH(choose_token(std::vector<float>{0.0f}, {1.0, 0}, 0.5),
                    Contains("top_k must be >= 1"));
}

TEST_CASE("token uniforms lie between 0 and 1 and differ by index", "[apps][sample]") {
  double sum = 0.0;
  for (uint64_t i = 0; i < 4000; ++i) {
    const double u = mixprec::token_uniform(7, i);
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
  }
  CHECK(std::fabs(sum / 4000 - 0.5) < 0.02);
  CHECK(mixprec::token_uniform(7, 0) != mixprec::token_uniform(8, 0));
}

TEST_CASE("mixprec sample continues the prompt, the same for one seed", "[apps][sample]") {
  ScratchDir dir("sample");
  const TinyGpt gpt(dir);
  const CliResult a = gpt.sample({"--prompt", "ROMEO:", "--tokens", "40", "--seed", "5"});
  require_ok(a);
  CHECK(a.out.rfind("ROMEO:", 0) == 0);
  CHECK(a.out.size() == 6 + 40 + 1);  // ASCII text, and a closing newline
  CHECK(a.out.back() == '\n');
  CHECK_THAT(a.err, Contains("sample: 40 tokens in"));
  CHECK_THAT(a.err, Contains("tokens/s (key/value cache, cpu, fp32)"));
  CHECK(gpt.sample({"--prompt", "ROMEO:", "--tokens", "40", "--seed", "5"}).out == a.out);
  CHECK(gpt.sample({"--prompt", "ROMEO:", "--tokens", "40", "--seed", "6"}).out != a.out);
  // Top-k 1 is the argmax chain, which no seed changes.
  const CliResult g1 = gpt.sample({"--tokens", "20", "--top-k", "1", "--seed", "1"});
  const CliResult g2 = gpt.sample({"--tokens", "20", "--top-k", "1", "--seed", "2"});
  require_ok(g1);
  CHECK(g1.out == g2.out);
}

TEST_CASE("mixprec sample gives the same text with the cache as without", "[apps][sample]") {
  ScratchDir dir("sample-cache");
  const TinyGpt gpt(dir);
  // 40 tokens after a 3-token prompt with block_size 16: 13 from the cache, then the window
  // slides and both paths run the full forward.
  const CliResult cached = gpt.sample({"--prompt", "Th", "--tokens", "40"});
  const CliResult full = gpt.sample({"--prompt", "Th", "--tokens", "40", "--no-cache"});
  require_ok(cached);
  require_ok(full);
  CHECK(cached.out == full.out);
  CHECK_THAT(full.err, Contains("(no cache, cpu, fp32)"));
  // 16-bit inference runs and says so.
  const CliResult bf16 = gpt.sample({"--tokens", "20", "--precision", "bf16"});
  require_ok(bf16);
  CHECK_THAT(bf16.err, Contains("cpu, bf16)"));
}

TEST_CASE("mixprec sample refuses bad input with one line and no text", "[apps][sample]") {
  ScratchDir dir("sample-bad");
  const TinyGpt gpt(dir);
  expect_bad_input(gpt.sample({"--prompt", "caf\xc3\xa9"}),
                   "--prompt: character 'é' (U+00E9) at position 3 is not in the vocabulary");
  expect_bad_input(gpt.sample({"--prompt", ""}), "--prompt is empty");
  expect_bad_input(gpt.sample({"--tokens", "0"}), "--tokens must be >= 1, got 0");
  expect_bad_input(gpt.sample({"--temperature", "0"}), "--temperature must be a number > 0");
  expect_bad_input(gpt.sample({"--temperature", "-1"}), "--temperature must be a number > 0");
  expect_bad_input(gpt.sample({"--temperature", "nan"}), "--temperature must be a number > 0");
  expect_bad_input(gpt.sample({"--temperature", "warm"}), "--temperature");
  expect_bad_input(gpt.sample({"--top-k", "0"}), "--top-k must be >= 1");
  expect_bad_input(gpt.sample({"--top-k", "-3"}), "--top-k must be >= 1");
  expect_bad_input(gpt.sample({"--set", "model.n_embd=64"}), "does not fit this model");
  expect_bad_input(gpt.sample({"--device", "gpu"}), "--device must be cpu, cuda or auto, got 'gpu'");
  expect_bad_input(gpt.sample({"--precision", "fp8"}),
                   "--precision must be fp32, fp16 or bf16, got 'fp8'");

  // A CNN's checkpoint, and a CNN's config.
  const std::string cnn = dir / "cnn/checkpoints/step_1";
  std::filesystem::create_directories(cnn);
  mixprec::write_safetensors(cnn + "/model.safetensors",
                             {{"0.weight", mixprec::Tensor::zeros({4, 1, 3, 3})}});
  write_text(cnn + "/state.json", "{\"step\": 1}");
  expect_bad_input(run_cli({"sample", gpt.config, "--checkpoint", cnn}), "holds no GPT");
  expect_bad_input(run_cli({"sample", config_path("cnn_fashion.yaml"), "--checkpoint", gpt.run}),
                   "describes a CNN");
  expect_bad_input(run_cli({"sample", gpt.config, "--checkpoint", dir / "nothing"}),
                   "nothing");
}
