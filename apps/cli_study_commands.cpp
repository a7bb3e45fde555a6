// Options live in shared_ptrs owned by the callbacks: CLI11 writes into them while parsing,
// and the action reads them after run_cli's parse, when this function's frame is gone.
#include "apps/cli_study_commands.h"

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench.h"
#include "apps/inspect/inspect.h"

namespace mixprec {

namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// An integer option's lower bound, said as the config's range errors say it ("must be >= 1,
// got -1") rather than as CLI11's numeric range, whose upper end is DBL_MAX in full.
CLI::Validator at_least(int64_t low) {
  return CLI::Validator(
      [low](std::string& text) -> std::string {
        int64_t value = 0;
        if (!CLI::detail::lexical_cast(text, value))
          return "expected an integer, got '" + text + "'";
        return value >= low ? "" : "must be >= " + std::to_string(low) + ", got " + text;
      },
      ">=" + std::to_string(low));
}

}  // namespace

void add_bench_command(CLI::App& app, std::function<void()>& action, std::ostream& out,
                       std::ostream& err) {
  auto options = std::make_shared<BenchOptions>();
  auto precisions = std::make_shared<std::string>("fp32,fp16,bf16");
  auto json = std::make_shared<bool>(false);
  CLI::App* bench =
      app.add_subcommand("bench", "Train one config once per precision and compare them");
  bench->add_option("config", options->config_path, "The YAML config file")->required();
  bench->add_option("--precisions", *precisions,
                    "Comma-separated: fp32, fp16, bf16, fp16-noscale (default fp32,fp16,bf16)");
  bench->add_option("--steps", options->steps, "Optimizer steps per precision (default: the config's)")
      ->check(at_least(1));
  bench->add_option("--warmup", options->warmup,
                    "First steps left out of the timing statistics (default 5)")
      ->check(at_least(0));
  bench->add_option("--out", options->out_dir, "Output folder (default runs/<name>-bench-<date>)");
  bench->add_option("--compare", options->compare,
                    "Another bench.json (e.g. from scripts/torch_bench.py) whose rows join the table")
      ->allow_extra_args(false);
  bench->add_option("--set", options->overrides, "Override a setting for every run (repeatable)")
      ->allow_extra_args(false);
  bench->add_flag("--json", *json, "Print bench.json's object on stdout (progress goes to stderr)");
  bench->callback([&action, &out, &err, options, precisions, json] {
    action = [&out, &err, options, precisions, json] {
      options->precisions = split_commas(*precisions);
      if (*json) {
        out << run_bench(*options, err).dump(2) << "\n";
      } else {
        run_bench(*options, out);
      }
    };
  });
}

void add_inspect_command(CLI::App& app, std::function<void()>& action, std::ostream& out) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Histograms of gradient magnitudes per layer against the FP16 range");
  inspect->add_option("config", options->config_path, "The YAML config file")->required();
  inspect->add_option("--steps", options->steps,
                      "Optimizer steps to train first, as the config says (default 0)")
      ->check(at_least(0));
  inspect->add_option("--batches", options->batches,
                      "Training batches whose gradients are gathered (default 1)")
      ->check(at_least(1));
  inspect->add_option("--out", options->out_dir,
                      "Output folder (default runs/<name>-inspect-<date>)");
  inspect->add_option("--set", options->overrides, "Override a setting (repeatable)")
      ->allow_extra_args(false);
  inspect->callback([&action, &out, options] {
    action = [&out, options] { run_inspect(*options, out); };
  });
}

}  // namespace mixprec
