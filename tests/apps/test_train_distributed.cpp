// `mpirun -np 2 mixprec train`: two ranks give the bits of one process with accumulation 2,
// agree on a fault one rank injects, resume each other's checkpoints, end together when a
// rank hangs or dies, and refuse bad input with one line.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/apps/train_test_support.h"

namespace {

using namespace train_test;

#ifdef MIXPREC_MPIEXEC
constexpr const char* kMpiexec = MIXPREC_MPIEXEC;
#else
constexpr const char* kMpiexec = "";
#endif

std::string quoted(const std::string& word) { return "'" + word + "'"; }

// The command that starts `ranks` ranks of mixprec, one OpenMP thread each (two cores are
// shared). The CPU backend's convolutions round differently with another thread count, so
// the one-process runs they are compared with take one thread too. Under the sanitizers,
// Open MPI's allocations left at exit are not this program's leaks (tests/CMakeLists.txt).
std::string mpirun(int ranks) {
  return std::string("env OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ") +
         kMpiexec +
         " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " " +
         quoted(mixprec_binary().string());
}

// Runs `command` through the shell, its output into `log`.out and .err; returns the exit code.
CliResult shell(const std::string& command, const std::string& log) {
  const int status = std::system((command + " > " + quoted(log + ".out") + " 2> " +
                                  quoted(log + ".err")).c_str());
  CliResult result;
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_text(log + ".out");
  result.err = read_text(log + ".err");
  return result;
}

// `train config --out run` (or `--resume run`) with `sets` as --set arguments, on `ranks`
// ranks, or as one process without mpirun when `ranks` is 0; `env` goes before the command.
CliResult train_ranks(int ranks, const std::string& config, const std::string& run,
                      const std::vector<std::string>& sets, const std::string& env = "",
                      const char* folder_flag = "--out") {
  const std::string program =
      ranks > 0 ? mpirun(ranks) : "env OMP_NUM_THREADS=1 " + quoted(mixprec_binary().string());
  std::string command = env + program + " train " + quoted(config) + " " + folder_flag + " " +
                        quoted(run);
  for (const std::string& s : sets) command += " --set " + quoted(s);
  return shell(command, run + (folder_flag == std::string("--out") ? "" : "-resumed"));
}

void train_one(const std::string& config, const std::string& run,
               const std::vector<std::string>& sets, const char* folder_flag = "--out") {
  const CliResult r = train_ranks(0, config, run, sets, "", folder_flag);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
}

bool mpi_ready() {
  if (std::string(kMpiexec).empty()) {
    WARN("this build has no MPI (scripts/setup.sh installs Open MPI); skipped");
    return false;
  }
  return true;
}

// The two runs' last checkpoints hold the same bytes: model.safetensors whole, and every field
// of state.json but the wall time and `ignored`.
void check_same_checkpoint(const std::string& a, const std::string& b, int step,
                           const std::vector<std::string>& ignored = {}) {
  CHECK(read_text(checkpoint_file(a, step, "model.safetensors")) ==
        read_text(checkpoint_file(b, step, "model.safetensors")));
  nlohmann::json sa = read_json(checkpoint_file(a, step, "state.json"));
  nlohmann::json sb = read_json(checkpoint_file(b, step, "state.json"));
  for (nlohmann::json* s : {&sa, &sb}) {
    s->erase("train_seconds");
    for (const std::string& key : ignored) s->erase(key);
  }
  for (const auto& [key, value] : sa.items()) {
    CAPTURE(key);
    CHECK(sb.contains(key));
    if (sb.contains(key)) CHECK(value == sb[key]);
  }
  CHECK(sa.size() == sb.size());
}

// metrics.jsonl's records without their timings.
std::vector<nlohmann::json> outcomes(const std::string& run) {
  std::vector<nlohmann::json> records = read_jsonl(fs::path(run) / "metrics.jsonl");
  for (nlohmann::json& r : records)
    for (const char* timing : {"step_ms", "elapsed_s", "samples_per_s", "tokens_per_s"})
      r.erase(timing);
  return records;
}

std::vector<std::string> small_gpt(std::vector<std::string> more) {
  std::vector<std::string> sets = mixprec_test::small_gpt_overrides(shakespeare_path());
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

}  // namespace

TEST_CASE("mpirun -np 2: a BF16 GPT with dropout has one process's bits with accumulation 2",
          "[apps][train][dist]") {
  if (!mpi_ready()) return;
  ScratchDir dir("dist-gpt");
  const std::string config = config_path("gpt_shakespeare.yaml");
  const auto sets = small_gpt({"precision=bf16", "model.dropout=0.1", "train.steps=30",
                               "train.log_every=5", "train.eval_every=15"});
  const CliResult two = train_ranks(2, config, dir / "two", sets);
  INFO(two.out << two.err);
  REQUIRE(two.code == 0);
  auto one_sets = sets;
  one_sets.push_back("train.accumulation_steps=2");
  train_one(config, dir / "one", one_sets);
  check_same_checkpoint(dir / "one", dir / "two", 30);
  CHECK(outcomes(dir / "one") == outcomes(dir / "two"));
  // Rank 0 alone speaks: one header, which states the step's size, and nothing on stderr.
  CHECK(std::count(two.out.begin(), two.out.end(), '\n') >= 1);
  CHECK_THAT(two.out, Catch::Contains("x 2 ranks (mpi), a step of batch_size 4 x 1 accumulation "
                                      "x 2 ranks = 8 examples"));
  CHECK(two.err.empty());
  const nlohmann::json summary = read_json(dir / "two/summary.json");
  CHECK(summary["ranks"] == 2);

  // The sharded optimizer gives the replicated one's bits, its state gathered into the same
  // state.json, and holds about half the optimizer state on rank 0 (AdamW: 8 bytes a
  // parameter replicated).
  auto shard_sets = sets;
  shard_sets.push_back("distributed.shard_optimizer=true");
  const CliResult sharded = train_ranks(2, config, dir / "sharded", shard_sets);
  INFO(sharded.out << sharded.err);
  REQUIRE(sharded.code == 0);
  check_same_checkpoint(dir / "two", dir / "sharded", 30);
  const nlohmann::json shard_summary = read_json(dir / "sharded/summary.json");
  const double parameters = summary["parameters"].get<double>();
  CHECK(summary["optimizer_state_bytes"].get<double>() == 8 * parameters);
  const double share = shard_summary["optimizer_state_bytes"].get<double>() / (8 * parameters);
  CHECK(share > 0.3);
  CHECK(share < 0.7);
}

TEST_CASE("mpirun -np 3 and -np 4: an FP16 GPT has one process's bits with accumulation N",
          "[apps][train][dist]") {
  if (!mpi_ready()) return;
  ScratchDir dir("dist-ranks");
  const std::string config = config_path("gpt_shakespeare.yaml");
  const auto sets = small_gpt({"precision=fp16", "train.steps=10", "train.log_every=5"});
  for (int ranks : {3, 4}) {
    CAPTURE(ranks);
    const std::string many = dir / ("ranks" + std::to_string(ranks));
    const std::string one = dir / ("one" + std::to_string(ranks));
    const CliResult r = train_ranks(ranks, config, many, sets);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    auto one_sets = sets;
    one_sets.push_back("train.accumulation_steps=" + std::to_string(ranks));
    train_one(config, one, one_sets);
    check_same_checkpoint(one, many, 10);
    CHECK(outcomes(one) == outcomes(many));
  }
}

TEST_CASE("mpirun -np 2: cnn_fashion in FP16 skips together when one rank overflows",
          "[apps][train][dist]") {
  if (!mpi_ready()) return;
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed (scripts/setup.sh installs it); skipped");
    return;
  }
  ScratchDir dir("dist-cnn");
  const std::string config = config_path("cnn_fashion.yaml");
  const std::vector<std::string> sets{"train.steps=30", "train.batch_size=32",
                                      "train.log_every=10", "train.eval_every=0",
                                      "debug.inject_nonfinite.step=5",
                                      "debug.inject_nonfinite.tensor=11.weight"};
  auto two_sets = sets;
  two_sets.push_back("debug.inject_nonfinite.rank=1");
  const CliResult two = train_ranks(2, config, dir / "two", two_sets);
  INFO(two.out << two.err);
  REQUIRE(two.code == 0);
  auto one_sets = sets;
  one_sets.push_back("train.accumulation_steps=2");
  train_one(config, dir / "one", one_sets);
  // The configs differ in the debug section, which names the injecting rank.
  check_same_checkpoint(dir / "one", dir / "two", 30, {"config"});
  CHECK(outcomes(dir / "one") == outcomes(dir / "two"));
  // The fault on rank 1 alone skipped the step on both, named the tensor and halved the
  // scale once.
  const auto steps = step_records(dir / "two");
  const nlohmann::json& fault = steps.at(5);
  CHECK(fault["skipped"] == true);
  CHECK(fault["nonfinite_tensors"] == nlohmann::json::array({"11.weight"}));
  CHECK(fault["next_scale"].get<double>() == fault["scale"].get<double>() / 2);
  CHECK(read_json(dir / "two/summary.json")["skipped_steps"] == 1);
  CHECK(read_json(dir / "two/summary.json")["final_scale"] == 32768.0);
}

TEST_CASE("mpirun -np 2 mixprec bench writes one bench from rank 0", "[apps][train][dist]") {
  if (!mpi_ready()) return;
  ScratchDir dir("dist-bench");
  std::string command = mpirun(2) + " bench " + quoted(config_path("gpt_shakespeare.yaml")) +
                        " --precisions fp32,bf16 --steps 6 --warmup 1 --out " +
                        quoted(dir / "bench");
  for (const std::string& s : small_gpt({})) command += " --set " + quoted(s);
  const CliResult r = shell(command, dir / "bench-log");
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json bench = read_json(dir / "bench/bench.json");
  CHECK(bench["ranks"] == 2);
  REQUIRE(bench["rows"].size() == 2);
  for (const char* precision : {"fp32", "bf16"}) {
    const nlohmann::json summary =
        read_json((fs::path(dir / "bench") / precision / "summary.json").string());
    CHECK(summary["ranks"] == 2);
    CHECK(summary["steps"] == 6);
  }
  // Rank 0 alone reports: the line saying it wrote bench.json comes once.
  size_t reports = 0;
  for (size_t at = r.out.find("bench.json and bench.md"); at != std::string::npos;
       at = r.out.find("bench.json and bench.md", at + 1))
    ++reports;
  CHECK(reports == 1);
}

TEST_CASE("a checkpoint of two ranks resumes in one process, and one process's under two ranks",
          "[apps][train][dist]") {
  if (!mpi_ready()) return;
  ScratchDir dir("dist-resume");
  const std::string config = config_path("gpt_shakespeare.yaml");
  // The cosine decays over 20 steps in every part (a resumed run keeps its first part's length).
  const auto base = small_gpt({"precision=fp16", "train.log_every=5", "schedule.warmup_steps=5",
                               "schedule.decay_steps=20"});
  auto one = base;
  one.push_back("train.accumulation_steps=2");
  auto with_steps = [](std::vector<std::string> sets, int steps) {
    sets.push_back("train.steps=" + std::to_string(steps));
    return sets;
  };
  train_one(config, dir / "whole", with_steps(one, 20));
  // Two ranks for 10 steps, then one process to 20.
  REQUIRE(train_ranks(2, config, dir / "a", with_steps(base, 10)).code == 0);
  train_one(config, dir / "a", with_steps(one, 20), "--resume");
  // schedule_steps records the length of the run that started (10), which the explicit
  // decay_steps makes irrelevant to the rates.
  check_same_checkpoint(dir / "whole", dir / "a", 20, {"schedule_steps"});
  // One process for 10 steps, then two ranks to 20.
  train_one(config, dir / "b", with_steps(one, 10));
  const CliResult resumed = train_ranks(2, config, dir / "b", with_steps(base, 20), "", "--resume");
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.code == 0);
  check_same_checkpoint(dir / "whole", dir / "b", 20, {"schedule_steps"});
}

TEST_CASE("a rank that hangs ends every rank within seconds, naming rank, operation and step",
          "[apps][train][dist]") {
  if (!mpi_ready()) return;
  ScratchDir dir("dist-stall");
  const auto start = std::chrono::steady_clock::now();
  const CliResult r =
      train_ranks(2, config_path("gpt_shakespeare.yaml"), dir / "run",
                  small_gpt({"train.steps=50", "distributed.timeout_s=2"}),
                  "MIXPREC_TEST_STALL_RANK=1:5 ");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(seconds < 15.0);
  CHECK_THAT(r.err, Catch::Matches("(.|\n)*rank 0: collective [a-z_]+ #[0-9]+ at step 5 did not "
                                   "finish within 2 s; aborting every rank(.|\n)*"));
}

TEST_CASE("a rank killed mid-run ends the job, and its last checkpoint stays loadable",
          "[apps][train][dist]") {
  if (!mpi_ready()) return;
  ScratchDir dir("dist-kill");
  const std::string run = dir / "run";
  const std::string config = config_path("gpt_shakespeare.yaml");
  const auto sets = small_gpt({"train.steps=1000000", "checkpoint.every=50"});
  std::string command = "bash " +
                        quoted((repo_root() / "tests/apps/distributed/kill_rank.sh").string()) +
                        " " + quoted(run) + " " + mpirun(2) + " train " + quoted(config) +
                        " --out " + quoted(run);
  for (const std::string& s : sets) command += " --set " + quoted(s);
  const CliResult r = shell(command, dir / "kill");
  INFO(r.out << r.err << read_text(run + ".err"));
  REQUIRE_THAT(r.out, Catch::StartsWith("exit="));
  CHECK_THAT(r.out, !Catch::StartsWith("exit=0 "));
  double seconds = 1e9;
  int leftover = -1;
  std::sscanf(r.out.c_str(), "exit=%*d seconds=%lf leftover=%d", &seconds, &leftover);
  CHECK(seconds < 15.0);
  CHECK(leftover == 0);
  CHECK_THAT(read_text(run + ".err"), Catch::Contains("rank 1"));
  std::vector<std::string> eval{"eval", config, "--checkpoint", run};
  for (const std::string& s : sets) eval.insert(eval.end(), {"--set", s});
  require_ok(run_cli(eval));
}

TEST_CASE("bad distributed input exits 2 with one line under mpirun", "[apps][train][dist]") {
  if (!mpi_ready()) return;
  ScratchDir dir("dist-bad");
  const std::string gpt = config_path("gpt_shakespeare.yaml");
  auto expect_one_error = [](const CliResult& r, const std::string& message) {
    INFO(r.out << r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, Catch::Contains("error: " + message));
    // One rank reports a setup error that every rank meets (mpirun adds its own notice).
    size_t errors = 0;
    for (size_t at = r.err.find("error: "); at != std::string::npos;
         at = r.err.find("error: ", at + 1))
      ++errors;
    CHECK(errors == 1);
  };
  expect_one_error(train_ranks(2, gpt, dir / "nccl", small_gpt({"distributed.backend=nccl"})),
                   "distributed.backend: nccl carries tensors on a GPU, and this run is on cpu");
  // 258 characters, 232 of them for training: 3 batches of 4 windows of 16 an epoch, which 2
  // ranks do not divide.
  const std::string text = dir / "text.txt";
  std::string corpus;
  while (corpus.size() < 240) corpus += "to be or not to be, that is the question. ";
  write_text(text, corpus);
  expect_one_error(train_ranks(2, gpt, dir / "divide",
                               small_gpt({"data.path=" + text, "train.epochs=1",
                                          "train.steps=0"})),
                   "train.epochs: 1 epoch(s) of");
  expect_one_error(train_ranks(2, gpt, dir / "rank",
                               small_gpt({"train.steps=3", "debug.inject_nonfinite.step=2",
                                          "debug.inject_nonfinite.tensor=loss",
                                          "debug.inject_nonfinite.rank=2"})),
                   "debug.inject_nonfinite.rank is 2 but the run has 2 rank(s)");
  CHECK(!fs::exists(dir / "nccl"));
}
