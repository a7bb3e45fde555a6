// Interrupts and crash safety, proven on the real `mixprec` program run as a child process:
// SIGINT and SIGTERM stop a run at a step boundary with a checkpoint from which `--resume`
// reaches the same bits as a run never stopped; a second signal during a save, and SIGKILL at
// many moments of a save (widened with the MIXPREC_TEST_SAVE_DELAY_MS hook), leave the
// previous checkpoint loadable and nothing half-written in sight.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "apps/checkpoint/checkpoint_dir.h"
#include "apps/checkpoint/safetensors.h"
#include "apps/train/interrupt.h"
#include "apps/train/trainer.h"
#include "core/error.h"
#include "train_test_support.h"

extern char** environ;

using namespace train_test;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

fs::path require_binary() {
  const fs::path binary = mixprec_binary();
  std::error_code error;
  INFO("these tests run the mixprec program, expected at '"
       << binary.string() << "'; build the `mixprec` target");
  REQUIRE(fs::is_regular_file(binary, error));
  return binary;
}

// A few thousand characters of words drawn from a fixed list by a fixed generator: enough
// text for the tiny GPT below, with no data set to install.
std::string write_corpus(const ScratchDir& dir) {
  static const char* const kWords[] = {
      "the", "of", "and", "to", "in", "is", "was", "he", "for", "it", "with", "as", "his",
      "on", "be", "at", "by", "had", "not", "are", "but", "from", "or", "have", "an", "they",
      "which", "one", "you", "were", "her", "all", "she", "there", "would", "their", "we",
      "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said"};
  std::string text;
  uint32_t state = 12345;
  for (int i = 0; i < 1500; ++i) {
    state = state * 1664525u + 1013904223u;
    text += kWords[(state >> 16) % (sizeof kWords / sizeof kWords[0])];
    text += (i % 17 == 16) ? ".\n" : " ";
  }
  const std::string path = dir / "corpus.txt";
  write_text(path, text);
  return path;
}

// A 2-layer GPT of 27k parameters on that corpus: about a millisecond a step on one core.
// Logs every step, so that metrics.jsonl shows at once that training runs.
std::vector<std::string> tiny_args(const std::string& corpus, int steps) {
  return {"--set", "data.path=" + corpus,
          "--set", "model.n_layer=2",
          "--set", "model.n_head=2",
          "--set", "model.n_embd=32",
          "--set", "model.block_size=16",
          "--set", "train.batch_size=8",
          "--set", "train.steps=" + std::to_string(steps),
          "--set", "train.log_every=1",
          "--set", "train.eval_every=0",
          "--set", "data.eval_batches=1",
          "--set", "schedule.warmup_steps=1",
          "--set", "device=cpu"};
}

std::vector<std::string> gpt_train_args(const std::string& out,
                                        const std::vector<std::string>& sets,
                                        const std::vector<std::string>& checkpointing) {
  std::vector<std::string> args{"train", config_path("gpt_shakespeare.yaml"), "--out", out};
  args.insert(args.end(), sets.begin(), sets.end());
  args.insert(args.end(), checkpointing.begin(), checkpointing.end());
  return args;
}

// A `mixprec` child process: its output in files, its environment this one's with one
// thread for OpenMP and, when asked, the save delay.
class Child {
 public:
  Child(const fs::path& program, std::vector<std::string> args, const std::string& log_prefix,
        int save_delay_ms = 0)
      : out_path_(log_prefix + ".out"), err_path_(log_prefix + ".err") {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (entry.rfind("MIXPREC_TEST_SAVE_DELAY_MS=", 0) == 0 ||
          entry.rfind("OMP_NUM_THREADS=", 0) == 0) {
        continue;
      }
      env.push_back(entry);
    }
    env.push_back("OMP_NUM_THREADS=1");
    if (save_delay_ms > 0) {
      env.push_back("MIXPREC_TEST_SAVE_DELAY_MS=" + std::to_string(save_delay_ms));
    }
    args.insert(args.begin(), program.string());
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    // Whatever this process blocks or ignores, the child starts with the defaults.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    const int spawned =
        posix_spawn(&pid_, argv[0], &actions, &attributes, argv.data(), envp.data());
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(spawned == 0);
  }

  ~Child() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool running() {
    if (status_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
    return !status_;
  }
  void signal(int number) { REQUIRE(::kill(pid_, number) == 0); }

  // Waits for the end (killing it after `limit`): the raw wait status.
  int wait(milliseconds limit = milliseconds(30000)) {
    const Clock::time_point deadline = Clock::now() + limit;
    while (running() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
    if (!status_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      status_ = status;
      FAIL("mixprec did not end within " << limit.count() << " ms; stderr:\n" << err());
    }
    return *status_;
  }

  std::string out() const { return read_text(out_path_); }
  std::string err() const { return read_text(err_path_); }

 private:
  std::string out_path_, err_path_;
  pid_t pid_ = 0;
  std::optional<int> status_;
};

// Polls `ready` every millisecond while the child runs; false when it ended first or
// `limit` passed.
template <typename Ready>
bool wait_for(Child& child, Ready ready, milliseconds limit = milliseconds(20000)) {
  const Clock::time_point deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (ready()) return true;
    if (!child.running()) return ready();
    std::this_thread::sleep_for(milliseconds(1));
  }
  return false;
}

bool exited_with(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Runs to the end and requires exit 0.
void run_ok(const fs::path& program, const std::vector<std::string>& args,
            const std::string& log_prefix) {
  Child child(program, args, log_prefix);
  const int status = child.wait();
  INFO(describe(status) << "; stdout:\n" << child.out() << "\nstderr:\n" << child.err());
  REQUIRE(exited_with(status, 0));
}

bool has_step_record(const std::string& run) {
  return read_text(run + "/metrics.jsonl").find("\"event\":\"step\"") != std::string::npos;
}

std::string final_weights(const std::string& run, int steps) {
  return read_text(mixprec::checkpoint_folder(run + "/checkpoints", steps) + "/model.safetensors");
}

// The weights after `steps` steps of the tiny GPT run straight through (the checkpoint
// settings do not change them), computed once per step count (every corpus is the same text).
std::string reference_weights(const fs::path& program, const std::string& corpus, int steps) {
  static std::map<int, std::string> cache;
  const int key = steps;
  if (!cache.count(key)) {
    ScratchDir dir("interrupt-reference");
    const std::string run = dir / "run";
    run_ok(program, gpt_train_args(run, tiny_args(corpus, steps), {}), dir / "log");
    cache[key] = final_weights(run, steps);
    REQUIRE(!cache[key].empty());
  }
  return cache[key];
}

// The names in the checkpoints folder, hidden ones included.
std::vector<std::string> names_in(const std::string& folder) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Waits (as wait_for does) until some name in `folder` satisfies `matches`.
template <typename Matches>
bool wait_for_name(Child& child, const std::string& folder, Matches matches) {
  return wait_for(child, [&] {
    const std::vector<std::string> names = names_in(folder);
    return std::any_of(names.begin(), names.end(), matches);
  });
}

// The step a name ".step_<N>.<anything>" or "step_<N>" refers to, or -1.
int64_t step_of_name(const std::string& name) {
  static const std::regex pattern(R"(^\.?step_(\d+)(\..*)?$)");
  std::smatch match;
  if (!std::regex_match(name, match, pattern)) return -1;
  return std::stoll(match[1].str());
}

// Every checkpoint visible in `checkpoints` is complete and reads back: its
// model.safetensors parses with the model's tensors and its state.json parses with the
// folder's step. Everything in sight (not hidden) is such a checkpoint.
void require_only_complete_checkpoints(const std::string& checkpoints) {
  const auto listed = mixprec::list_checkpoints(checkpoints);
  std::set<std::string> listed_names;
  for (const auto& [step, path] : listed) {
    INFO("checkpoint " << path);
    listed_names.insert(fs::path(path).filename().string());
    const auto model = mixprec::read_safetensors(path + "/model.safetensors");
    CHECK(model.tensors.count("transformer.wte.weight") == 1);
    const nlohmann::json state = read_json(path + "/state.json");
    CHECK(state.at("step").get<int64_t>() == step);
  }
  for (const std::string& name : names_in(checkpoints)) {
    if (name.front() == '.') continue;
    INFO("a visible entry that is no complete checkpoint: " << name);
    CHECK(listed_names.count(name) == 1);
  }
}

std::vector<int64_t> one_to(int64_t n) {
  std::vector<int64_t> steps;
  for (int64_t i = 1; i <= n; ++i) steps.push_back(i);
  return steps;
}

// `command` for `sh -c`, its first word, "mixprec", replaced by the program's path; exec, so
// that the shell's process is the program's (a kill after a timeout then reaches it).
std::string with_program(const std::string& command, const fs::path& program) {
  REQUIRE(command.rfind("mixprec ", 0) == 0);
  return "exec '" + program.string() + "'" + command.substr(std::strlen("mixprec"));
}

// One signal once the child logged a step; then the exit code, the resume command (run as
// printed, through a shell), the checkpoint at the step it stopped, no summary, and a
// resumed run that ends on the uninterrupted run's bits.
void interrupt_once_and_resume(int signal, int expected_code, int total_steps,
                               const std::vector<std::string>& checkpointing, int save_delay_ms) {
  const fs::path program = require_binary();
  ScratchDir dir("interrupt-once");
  const std::string corpus = write_corpus(dir);
  // A value with spaces and brackets, equal to the config's own, so that the printed command
  // must quote it for the shell.
  std::vector<std::string> sets = tiny_args(corpus, total_steps);
  sets.insert(sets.end(), {"--set", "optimizer.betas=[0.9, 0.99]"});
  const std::string reference = reference_weights(program, corpus, total_steps);
  const std::string run = dir / "run";
  const std::string checkpoints = run + "/checkpoints";

  Child child(program, gpt_train_args(run, sets, checkpointing), dir / "interrupted",
              save_delay_ms);
  REQUIRE(wait_for(child, [&] { return has_step_record(run); }));
  child.signal(signal);
  const int status = child.wait();
  const std::string err = child.err();
  INFO(describe(status) << "; stdout:\n" << child.out() << "\nstderr:\n" << err);
  REQUIRE(exited_with(status, expected_code));

  // "interrupted at step N of M; checkpoint <dir>; resume with: <command>", on one line.
  std::smatch match;
  REQUIRE(std::regex_search(err, match,
                            std::regex(R"(interrupted at step (\d+) of (\d+); checkpoint ([^;]+); )"
                                       R"(resume with: ([^\n]+)\n)")));
  const int64_t step = std::stoll(match[1].str());
  CHECK(match[2].str() == std::to_string(total_steps));
  CHECK(step >= 1);
  CHECK(step < total_steps);
  CHECK(match[3].str() == mixprec::checkpoint_folder(checkpoints, step));
  const std::string command = match[4].str();
  std::string expected =
      "mixprec train " + config_path("gpt_shakespeare.yaml") + " --resume " + run;
  std::vector<std::string> all_sets = sets;
  all_sets.insert(all_sets.end(), checkpointing.begin(), checkpointing.end());
  for (size_t i = 1; i < all_sets.size(); i += 2) {
    const std::string& value = all_sets[i];
    expected += " --set " + (value.find(' ') == std::string::npos ? value : "'" + value + "'");
  }
  CHECK(command == expected);
  CHECK(err.find(mixprec::signal_name(signal) + " received") != std::string::npos);

  // The checkpoint of the step it stopped at is the newest; nothing claims the run finished.
  const auto listed = mixprec::list_checkpoints(checkpoints);
  REQUIRE(!listed.empty());
  CHECK(listed.back().first == step);
  CHECK(mixprec::load_checkpoint(run).state.at("step").get<int64_t>() == step);
  require_only_complete_checkpoints(checkpoints);
  CHECK_FALSE(fs::exists(run + "/summary.json"));
  CHECK(logged_steps(run) == one_to(step));

  // The printed command, through a shell, finishes the run on the same bits.
  Child resumed(fs::path("/bin/sh"), {"-c", with_program(command, program)}, dir / "resumed");
  const int resumed_status = resumed.wait();
  INFO("resumed: " << describe(resumed_status) << "; stdout:\n"
                   << resumed.out() << "\nresumed stderr:\n" << resumed.err());
  REQUIRE(exited_with(resumed_status, 0));
  CHECK(resumed.out().find("resumed at step " + std::to_string(step)) != std::string::npos);
  CHECK(final_weights(run, total_steps) == reference);
  CHECK(fs::exists(run + "/summary.json"));
  CHECK(logged_steps(run) == one_to(total_steps));
}

}  // namespace

TEST_CASE("interrupt: the guard records the first signal and restores the old handlers",
          "[interrupt]") {
  struct sigaction before {};
  REQUIRE(::sigaction(SIGTERM, nullptr, &before) == 0);
  {
    mixprec::InterruptGuard guard;
    CHECK(mixprec::interrupt_signal() == 0);
    struct sigaction during {};
    REQUIRE(::sigaction(SIGTERM, nullptr, &during) == 0);
    CHECK(during.sa_handler != before.sa_handler);
    CHECK((during.sa_flags & SA_RESTART) != 0);
    {
      mixprec::InterruptGuard nested;  // does nothing: the outer one stays in charge
    }
    struct sigaction after_nested {};
    REQUIRE(::sigaction(SIGTERM, nullptr, &after_nested) == 0);
    CHECK(after_nested.sa_handler == during.sa_handler);
    // The first signal is only recorded: this process goes on.
    REQUIRE(::raise(SIGTERM) == 0);
    CHECK(mixprec::interrupt_signal() == SIGTERM);
  }
  struct sigaction after {};
  REQUIRE(::sigaction(SIGTERM, nullptr, &after) == 0);
  CHECK(after.sa_handler == before.sa_handler);
  // A new guard starts with a clean record.
  mixprec::InterruptGuard again;
  CHECK(mixprec::interrupt_signal() == 0);
}

TEST_CASE("interrupt: the resume command quotes what a shell would split", "[interrupt]") {
  const mixprec::TrainingInterrupted stopped(SIGINT, 7, 100, "runs/a b",
                                             "runs/a b/checkpoints/step_7");
  CHECK(stopped.exit_code() == 130);
  CHECK(mixprec::TrainingInterrupted(SIGTERM, 1, 2, "r", "c").exit_code() == 143);
  CHECK(mixprec::interrupted_message(
            stopped, "configs/x.yaml",
            {"train.steps=100", "loss_scale={policy: static}", "name=it's"}) ==
        "interrupted at step 7 of 100; checkpoint runs/a b/checkpoints/step_7; resume with: "
        "mixprec train configs/x.yaml --resume 'runs/a b' --set train.steps=100 "
        "--set 'loss_scale={policy: static}' --set 'name=it'\\''s'");
  const mixprec::TrainingInterrupted early(SIGTERM, 0, 100, "runs/x", "");
  CHECK(mixprec::interrupted_message(early, "c.yaml", {}).find("before training started") !=
        std::string::npos);
}

TEST_CASE("interrupt: a signal before training started writes nothing", "[interrupt]") {
  ScratchDir dir("interrupt-early");
  const std::string corpus = write_corpus(dir);
  mixprec::TrainOptions options;
  options.config_path = config_path("gpt_shakespeare.yaml");
  options.overrides = tiny_args(corpus, 5);
  options.overrides.erase(std::remove(options.overrides.begin(), options.overrides.end(), "--set"),
                          options.overrides.end());
  options.out_dir = dir / "run";
  // The guard run_training installs is nested in this one, which has already seen SIGINT.
  mixprec::InterruptGuard outer;
  REQUIRE(::raise(SIGINT) == 0);
  std::ostringstream log;
  try {
    mixprec::run_training(options, log);
    FAIL("run_training did not stop");
  } catch (const mixprec::TrainingInterrupted& e) {
    CHECK(e.signal() == SIGINT);
    CHECK(e.exit_code() == 130);
    CHECK(e.checkpoint().empty());
    CHECK(mixprec::interrupted_message(e, options.config_path, options.overrides)
              .find("nothing was written") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(options.out_dir));
}

TEST_CASE("interrupt: remove_unfinished_saves clears dead saves and puts a moved-aside step back",
          "[interrupt]") {
  ScratchDir dir("interrupt-unfinished");
  const fs::path checkpoints = dir.path() / "checkpoints";
  mixprec::CheckpointData data;
  data.model = {{"w", mixprec::Tensor::from_vector({1.0f, 2.0f}, {2})}};
  data.state = {{"step", 6}};
  mixprec::save_checkpoint(checkpoints.string(), 6, data, 0);
  // The id of a process that has ended, of a running one that is not this one, and this one.
  Child ended(fs::path("/bin/true"), {}, dir / "true");
  REQUIRE(exited_with(ended.wait(), 0));
  const std::string dead = std::to_string(ended.pid());
  const std::string alive = std::to_string(::getppid());
  const std::string self = std::to_string(::getpid());
  const auto complete_copy = [&](const std::string& name) {
    fs::copy(checkpoints / "step_6", checkpoints / name, fs::copy_options::recursive);
  };
  complete_copy(".step_5.old-" + dead);  // step_5 moved aside, the new one never renamed in
  complete_copy(".step_6.old-" + dead);  // step_6 moved aside, the new one in place
  complete_copy(".step_9.tmp-" + dead);  // written completely, killed before the rename
  fs::create_directories(checkpoints / (".step_8.tmp-" + self));  // half written
  complete_copy(".step_3.del-" + dead);  // being removed by keep
  fs::create_directories(checkpoints / (".step_7.tmp-" + alive));  // another process's save
  for (const char* name : {".hidden", ".step_x.tmp-1", ".step_4.new-1", ".step_4.tmp-", "notes"}) {
    fs::create_directories(checkpoints / name);
  }

  CHECK(mixprec::remove_unfinished_saves(checkpoints.string()) == 5);
  CHECK(names_in(checkpoints.string()) ==
        std::vector<std::string>{".hidden", ".step_4.new-1", ".step_4.tmp-",
                                 ".step_7.tmp-" + alive, ".step_x.tmp-1", "notes", "step_5",
                                 "step_6"});
  CHECK(mixprec::load_checkpoint((checkpoints / "step_5").string()).state.at("step") == 6);
  CHECK(mixprec::remove_unfinished_saves(checkpoints.string()) == 0);
  CHECK(mixprec::remove_unfinished_saves((dir.path() / "missing").string()) == 0);
}

TEST_CASE("interrupt: MIXPREC_TEST_SAVE_DELAY_MS pauses each stage of a save", "[interrupt]") {
  ScratchDir dir("interrupt-delay");
  const std::string checkpoints = dir / "checkpoints";
  mixprec::CheckpointData data;
  data.model = {{"w", mixprec::Tensor::from_vector({1.0f}, {1})}};
  data.state = {{"step", 1}};
  struct Unset {
    ~Unset() { ::unsetenv("MIXPREC_TEST_SAVE_DELAY_MS"); }
  } unset;
  // Three pauses: after each of the two files, and after the rename.
  ::setenv("MIXPREC_TEST_SAVE_DELAY_MS", "40", 1);
  const Clock::time_point start = Clock::now();
  mixprec::save_checkpoint(checkpoints, 1, data, 0);
  CHECK(Clock::now() - start >= milliseconds(120));
  // A value that is no number of milliseconds is refused before anything is written.
  ::setenv("MIXPREC_TEST_SAVE_DELAY_MS", "40ms", 1);
  CHECK_THROWS_WITH(mixprec::save_checkpoint(checkpoints, 2, data, 0),
                    Catch::Matchers::Contains("MIXPREC_TEST_SAVE_DELAY_MS"));
  CHECK(names_in(checkpoints) == std::vector<std::string>{"step_1"});
}

TEST_CASE("interrupt: SIGINT stops at a step with a checkpoint, exit 130, resume is bit-identical",
          "[interrupt]") {
  // No periodic checkpoints: the one at the step it stopped can only be the interrupt's.
  // 800 steps of about a millisecond: the signal comes long before the end.
  interrupt_once_and_resume(SIGINT, 130, 800,
                            {"--set", "checkpoint.every=0", "--set", "checkpoint.keep=0"}, 0);
}

TEST_CASE("interrupt: SIGTERM during checkpointed steps exits 143, resume is bit-identical",
          "[interrupt]") {
  // A checkpoint every step, each slowed: the signal lands in or between saves, the step it
  // stops at was just saved, and keep still holds. Fewer steps: every save fsyncs.
  interrupt_once_and_resume(SIGTERM, 143, 40,
                            {"--set", "checkpoint.every=1", "--set", "checkpoint.keep=2"}, 5);
}

TEST_CASE("interrupt: a second signal during a save exits at once and keeps the last checkpoint",
          "[interrupt]") {
  const fs::path program = require_binary();
  ScratchDir dir("interrupt-twice");
  const std::string corpus = write_corpus(dir);
  constexpr int kSteps = 40;
  const std::string run = dir / "run";
  const std::string checkpoints = run + "/checkpoints";
  const std::vector<std::string> sets = tiny_args(corpus, kSteps);
  const std::vector<std::string> checkpointing{"--set", "checkpoint.every=10", "--set",
                                               "checkpoint.keep=0"};
  // Each save takes three pauses of 400 ms: the signals land in the second save's first two,
  // before its rename.
  Child child(program, gpt_train_args(run, sets, checkpointing), dir / "twice", 400);
  const std::string hidden_prefix = ".step_20.tmp-";
  REQUIRE(wait_for_name(child, checkpoints, [&](const std::string& name) {
    return name.rfind(hidden_prefix, 0) == 0;
  }));
  child.signal(SIGINT);
  // The second is sent once the first has been taken: two signals pending at once would be
  // delivered as one.
  REQUIRE(
      wait_for(child, [&] { return child.err().find("SIGINT received") != std::string::npos; }));
  child.signal(SIGINT);
  const int status = child.wait();
  const std::string err = child.err();
  INFO(describe(status) << "; stderr:\n" << err);
  CHECK(exited_with(status, 130));
  CHECK(err.find("SIGINT received") != std::string::npos);
  CHECK(err.find("stopping at once") != std::string::npos);
  CHECK(err.find("interrupted at step") == std::string::npos);

  // Nothing visible changed: step_10 is the newest and loads; the save of step 20 is only
  // its hidden temporary folder.
  const auto listed = mixprec::list_checkpoints(checkpoints);
  REQUIRE(listed.size() == 1);
  CHECK(listed.back().first == 10);
  require_only_complete_checkpoints(checkpoints);
  const mixprec::LoadedCheckpoint loaded = mixprec::load_checkpoint(run);
  CHECK(loaded.state.at("step") == 10);
  CHECK(names_in(checkpoints) ==
        std::vector<std::string>{hidden_prefix + std::to_string(child.pid()), "step_10"});
  CHECK_FALSE(fs::exists(run + "/summary.json"));

  // --resume clears the debris and finishes on the uninterrupted run's bits.
  run_ok(program, as_resume(gpt_train_args(run, sets, checkpointing)), dir / "resumed");
  CHECK(names_in(checkpoints) ==
        std::vector<std::string>{"step_10", "step_20", "step_30", "step_40"});
  CHECK(final_weights(run, kSteps) == reference_weights(program, corpus, kSteps));
}

TEST_CASE("interrupt: SIGKILL at any moment of a save leaves the old or the new checkpoint",
          "[interrupt]") {
  const fs::path program = require_binary();
  ScratchDir dir("interrupt-kill");
  const std::string corpus = write_corpus(dir);
  constexpr int kSteps = 16;
  constexpr int kEvery = 4;
  constexpr int kDelayMs = 30;  // a save: three pauses of 30 ms around its writes and renames
  const std::vector<std::string> sets = tiny_args(corpus, kSteps);
  // keep=1: the save also removes the previous checkpoint, after the new one is in place.
  const std::vector<std::string> checkpointing{
      "--set", "checkpoint.every=" + std::to_string(kEvery), "--set", "checkpoint.keep=1"};
  const std::string reference = reference_weights(program, corpus, kSteps);

  // Kill times from the moment the save of step 8 starts (its hidden folder appears) to past
  // its end: before the files, between them, before and after the rename, during removal.
  std::map<std::string, int> outcomes;
  for (int trial = 0; trial < 12; ++trial) {
    const int offset_ms = trial * 10;
    INFO("SIGKILL " << offset_ms << " ms into the save of step 8");
    ScratchDir trial_dir("interrupt-kill-trial");
    const std::string run = trial_dir / "run";
    const std::string checkpoints = run + "/checkpoints";
    {
      Child child(program, gpt_train_args(run, sets, checkpointing), trial_dir / "killed",
                  kDelayMs);
      REQUIRE(wait_for_name(child, checkpoints,
                            [](const std::string& name) { return step_of_name(name) >= 8; }));
      std::this_thread::sleep_for(milliseconds(offset_ms));
      if (!child.running()) {
        // Only when this process was held up for the whole rest of the run.
        WARN("the run ended before the kill at " << offset_ms << " ms; trial skipped");
        continue;
      }
      child.signal(SIGKILL);
      const int status = child.wait();
      INFO(describe(status) << "; stderr:\n" << child.err());
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == SIGKILL);
    }

    // The save under way was the newest step named in the folder, hidden or not; the newest
    // checkpoint in sight is that one or the one before it, complete either way.
    const std::vector<std::string> names = names_in(checkpoints);
    INFO("checkpoints/ after the kill: " << nlohmann::json(names).dump());
    int64_t newest_named = -1;
    for (const std::string& name : names) newest_named = std::max(newest_named, step_of_name(name));
    const auto listed = mixprec::list_checkpoints(checkpoints);
    REQUIRE(!listed.empty());
    const int64_t newest = listed.back().first;
    CHECK((newest == newest_named || newest == newest_named - kEvery));
    CHECK(listed.size() <= 2);  // keep=1, plus the new one while the old is being removed
    require_only_complete_checkpoints(checkpoints);
    const mixprec::LoadedCheckpoint loaded = mixprec::load_checkpoint(run);
    CHECK(loaded.path == mixprec::checkpoint_folder(checkpoints, newest));
    CHECK(loaded.state.at("step").get<int64_t>() == newest);
    CHECK(loaded.model.count("transformer.wte.weight") == 1);
    const bool hidden = std::any_of(names.begin(), names.end(),
                                    [](const std::string& n) { return n.front() == '.'; });
    outcomes[newest == newest_named ? (listed.size() == 2 ? "new, old not yet removed" : "new")
                                    : "old"]++;

    // --resume clears what the kill left and ends on the uninterrupted run's bits.
    run_ok(program, as_resume(gpt_train_args(run, sets, checkpointing)), trial_dir / "resumed");
    CHECK(final_weights(run, kSteps) == reference);
    for (const std::string& name : names_in(checkpoints)) CHECK(name.front() != '.');
    if (hidden) outcomes["hidden debris cleared by --resume"]++;
  }
  // The kills landed on both sides of the rename.
  INFO("outcomes: " << nlohmann::json(outcomes).dump());
  CHECK(outcomes["old"] > 0);
  CHECK(outcomes["new"] + outcomes["new, old not yet removed"] > 0);
}
