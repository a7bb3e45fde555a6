// The `bench` and `inspect` subcommands of the CLI: their flags, and what each runs once
// parsing succeeded (set into `action`, as every command of run_cli does).
#pragma once

#include <functional>
#include <ostream>

#include <CLI/CLI.hpp>

namespace mixprec {

// `mixprec bench CONFIG [--precisions fp32,fp16,bf16] [--steps N] [--warmup N] [--out DIR]
// [--json] [--compare FILE]... [--set key=value]...`. With --json, stdout carries only the
// bench.json object and the progress goes to `err`.
void add_bench_command(CLI::App& app, std::function<void()>& action, std::ostream& out,
                       std::ostream& err);

// `mixprec inspect CONFIG [--steps N] [--batches N] [--out DIR] [--set key=value]...`.
void add_inspect_command(CLI::App& app, std::function<void()>& action, std::ostream& out);

}  // namespace mixprec
