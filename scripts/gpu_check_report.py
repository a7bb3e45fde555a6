#!/usr/bin/env python3
"""The JSON files and the summary tables of scripts/gpu_check.sh, from what its stages wrote.

  gpu_check_report.py gather-train RUNS_TSV TRAIN_JSON
  gpu_check_report.py gather-compare RUNS_TSV COMPARE_JSON
  gpu_check_report.py bench-table BENCH_JSON TRAIN_JSON FP16_PEAK HBM_PEAK
  gpu_check_report.py train-table TRAIN_JSON
  gpu_check_report.py compare-table COMPARE_JSON BENCH_JSON FP16_PEAK

gather-*: the stage's runs.tsv (one tab-separated line per run, as gpu_check.sh writes it)
joined with the files each run left (summary.json, the end of its output, its kernel profile
and tuning log; or its bench.json rows) into one JSON file, since only eight files come back
from the GPU machine. *-table: rows of the summary table, printed. A step time, rate or
counter that is missing, not a number, not finite or not above zero prints as missing ("n/a",
"no ... counter") and enters no ratio; nothing here fails on a run that failed. Standard
library only: the GPU machine has python3 but nothing installed for it.
"""
import json
import math
import os
import re
import sys

LABEL = 34  # width of the first column of the kernel-benchmark rows


def number(value):
    """`value` if it is a finite number, else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def positive(value):
    """`value` if it is a finite number above 0, else None."""
    value = number(value)
    return value if value is not None and value > 0 else None


def median_ms(run):
    """A training run's median step in ms (its summary.json), if it is a positive number."""
    return positive(run.get("summary", {}).get("median_step_ms"))


def read_lines(path):
    with open(path, errors="replace") as f:
        return f.read().splitlines()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def benchmarks(path):
    """Google Benchmark's runs in `path`, by name; empty when the file is missing."""
    if not os.path.isfile(path):
        return {}
    return {b["name"]: b for b in read_json(path).get("benchmarks", [])}


def tsv_rows(path, fields):
    with open(path) as f:
        for line in f:
            yield line.rstrip("\n").split("\t", fields - 1)


# --- gather ---------------------------------------------------------------------------------

def gather_train(runs_tsv, train_json):
    """runs.tsv lines: config, precision, status, run folder, console log, kernel profile."""
    runs = []
    for config, precision, status, run_dir, run_log, profile in tsv_rows(runs_tsv, 6):
        run = {"config": config, "precision": precision, "status": status}
        if profile and os.path.isfile(profile):
            run["kernel_profile"] = read_lines(profile)
        summary = os.path.join(run_dir, "summary.json") if run_dir else ""
        if summary and os.path.isfile(summary):
            run["summary"] = read_json(summary)
        if run_log and os.path.isfile(run_log):
            run["output_tail"] = read_lines(run_log)[-20:]
        if run_dir and os.path.isfile(run_dir + ".autotune.txt"):
            run["autotune"] = read_lines(run_dir + ".autotune.txt")
        runs.append(run)
    with open(train_json, "w") as f:
        json.dump({"runs": runs}, f, indent=2)


def gather_compare(runs_tsv, compare_json):
    """runs.tsv lines: config label, status, the run's bench.json."""
    configs = []
    for label, status, bench in tsv_rows(runs_tsv, 3):
        entry = {"config": label, "status": status}
        if status == "ok" and os.path.isfile(bench):
            entry["rows"] = read_json(bench).get("rows", [])
        configs.append(entry)
    with open(compare_json, "w") as f:
        json.dump({"configs": configs}, f, indent=2)


# --- the kernel benchmarks ------------------------------------------------------------------

BENCH_ROWS = [
    ("GEMM 4096^3 FP16", "BM_CudaGemm/F16/4096/manual_time", "TFLOP/s"),
    ("GEMM 4096^3 BF16", "BM_CudaGemm/BF16/4096/manual_time", "TFLOP/s"),
    ("GEMM 4096^3 FP16 (tuned)", "BM_CudaGemmTuned/F16/4096/manual_time", "TFLOP/s"),
    ("GEMM 4096^3 BF16 (tuned)", "BM_CudaGemmTuned/BF16/4096/manual_time", "TFLOP/s"),
    ("GEMM 4096^3 FP32 (TF32 off)", "BM_CudaGemm/F32/4096/manual_time", "TFLOP/s"),
    ("GEMM 4096^3 FP32 (TF32 on)", "BM_CudaGemm/TF32/4096/manual_time", "TFLOP/s"),
    ("add 25M FP16", "BM_CudaAdd/F16/25000000/manual_time", "GB/s"),
    ("add 25M FP32", "BM_CudaAdd/F32/25000000/manual_time", "GB/s"),
    ("unscale_and_check 25M/100 FP16", "BM_CudaUnscaleAndCheck/F16/manual_time", "GB/s"),
    ("unscale_and_check 25M/100 FP32", "BM_CudaUnscaleAndCheck/F32/manual_time", "GB/s"),
    ("amp + AdamW tail, GPT, FP16", "BM_CudaAmpStep/manual_time", "us/step"),
    ("attn softmax fwd+bwd (GPT), fused", "BM_CudaAttentionSoftmax/fused/manual_time", "us/layer"),
    ("attn softmax fwd+bwd, composed", "BM_CudaAttentionSoftmax/composed/manual_time", "us/layer"),
    ("c_fc+gelu fwd+bwd (GPT), fused", "BM_CudaLinearGelu/fused/manual_time", "us/layer"),
    ("c_fc+gelu fwd+bwd, composed", "BM_CudaLinearGelu/composed/manual_time", "us/layer"),
    ("CNN batch of 512 built, 1 thread", "BM_ImageBatch/1/real_time", "us/batch"),
    ("CNN batch of 512 built, 4 threads", "BM_ImageBatch/4/real_time", "us/batch"),
]

# The FP16 GEMM's runs whose better figure is the "share of the peak".
FP16_GEMMS = ("BM_CudaGemm/F16/4096/manual_time", "BM_CudaGemmTuned/F16/4096/manual_time")


def bench_table(bench_json, train_json, fp16_peak, hbm_peak):
    runs = benchmarks(bench_json)
    # The FP16 GPT step of the training stage, if it ran: the amp tail is quoted as its share.
    gpt_fp16_ms = None
    if os.path.isfile(train_json):
        for run in read_json(train_json).get("runs", []):
            if run["config"] == "gpt_shakespeare_gpu" and run["precision"] == "fp16" and \
                    median_ms(run):
                gpt_fp16_ms = median_ms(run)
    for label, name, unit in BENCH_ROWS:
        run = runs.get(name)
        if run is None:
            print(f"{label:<{LABEL}} not run")
        elif run.get("error_occurred"):
            print(f"{label:<{LABEL}} error: {run.get('error_message', '?')}")
        elif unit == "us/batch":
            # The host's work per CNN step in the data prefetcher: above the step time, it
            # bounds it.
            unit_name = run.get("time_unit", "?") + "/batch"
            if positive(run.get("real_time")) is None:
                print(f"{label:<{LABEL}} no real_time")
            else:
                print(f"{label:<{LABEL}} {run['real_time']:8.0f} {unit_name:<8} on the host")
        elif positive(run.get(unit)) is None:
            print(f"{label:<{LABEL}} no {unit} counter")
        else:
            value = run[unit]
            if unit == "TFLOP/s":
                print(f"{label:<{LABEL}} {value:8.1f} TFLOP/s  {100 * value / fp16_peak:5.1f}% "
                      f"of {fp16_peak:.0f} FP16 peak")
            elif unit == "us/step":
                share = f"  {100 * value / (1000 * gpt_fp16_ms):5.1f}% of the " \
                        f"{gpt_fp16_ms:.2f} ms FP16 GPT step" if gpt_fp16_ms else ""
                print(f"{label:<{LABEL}} {value:8.0f} us/step{share}")
            elif unit == "us/layer":
                print(f"{label:<{LABEL}} {value:8.0f} us/layer (forward + backward, x6 layers "
                      "per step)")
            else:
                print(f"{label:<{LABEL}} {value:8.0f} GB/s     {100 * value / hbm_peak:5.1f}% "
                      f"of {hbm_peak:.0f} GB/s HBM")


# --- the training stage ---------------------------------------------------------------------

GRAPH_SUFFIX = " cuda_graph"


def train_rows(runs):
    """One line per run: median step, throughput, val loss, FP16 speed-up, syncs, replays."""
    # FP16's speed-up is the FP32 run's median step time over its own, per config.
    fp32_ms = {run["config"]: median_ms(run) for run in runs
               if run["precision"] == "fp32" and run["status"] == "ok" and median_ms(run)}
    # A recorded run (train.cuda_graph) against the eager run of its config and precision.
    eager_ms = {(run["config"], run["precision"]): median_ms(run)
                for run in runs if run["status"] == "ok"}
    # The label column fits the longest label, so that the figures line up.
    width = max([44] + [len(f"train {run['config']} {run['precision']}") for run in runs])
    print(f"{'training (mixprec train)':<{width}} median step, throughput, final val loss, "
          "FP16 speed-up, host syncs per step")
    for run in runs:
        label = f"train {run['config']} {run['precision']}"
        summary = run.get("summary")
        if run["status"] != "ok" or summary is None:
            print(f"{label:<{width}} "
                  f"{run['status'] if run['status'] != 'ok' else 'no summary.json'}")
            continue
        ms = positive(summary.get("median_step_ms"))
        unit = "tokens/s " if "tokens_per_s" in summary else "samples/s"
        rate = positive(summary.get("tokens_per_s" if "tokens_per_s" in summary else
                                    "samples_per_s"))
        throughput = (f"{rate:9.0f}" if rate else f"{'n/a':>9}") + f" {unit}"
        val_loss = number(summary.get("val_loss"))
        step = f"{ms:8.2f}" if ms else f"{'n/a':>8}"
        line = f"{label:<{width}} {step} ms/step {throughput}  val_loss " + \
            (f"{val_loss:.3f}" if val_loss is not None else "n/a")
        if summary.get("skipped_steps"):
            line += f"  {summary['skipped_steps']} skipped"
        syncs = number(summary.get("host_syncs_per_step"))
        if syncs is not None:
            line += f"  {syncs:.2f} syncs/step"
        if run["precision"] == "fp16" and run["config"] in fp32_ms and ms:
            line += f"  {fp32_ms[run['config']] / ms:.2f}x FP32"
        graph = summary.get("cuda_graph")
        if isinstance(graph, dict):
            line += f"  {graph.get('recordings')} recorded, {graph.get('replays')} replayed"
            eager = eager_ms.get((run["config"][:-len(GRAPH_SUFFIX)], run["precision"]))
            if run["config"].endswith(GRAPH_SUFFIX) and eager and ms:
                line += f"  {eager / ms:.2f}x eager"
        print(line)


def autotune_sections(lines):
    """A tuning log's problems: (header, [(candidate, median us or None when it failed)])."""
    sections, current = [], None
    for line in lines:
        if not line.startswith("  "):
            current = (line, [])
            sections.append(current)
        elif current is not None:
            m = re.match(r"  (.*?)  median ([0-9.]+) us", line)
            if m:
                current[1].append((m.group(1), float(m.group(2))))
            elif line.endswith("  failed"):
                current[1].append((line[2:-len("  failed")], None))
    return sections


def convolution_choices(runs):
    """What determinism costs each convolution, from the tuning logs of the runs that timed
    every algorithm, atomics included (the whole logs are in train.json): the default plan's
    algorithm (the heuristic's first deterministic one), the fastest deterministic one and the
    fastest of all, each with its median time."""
    def named(candidate):
        if candidate is None:
            return "none"
        name, us = candidate
        return f"{name.split(',')[0]} " + (f"{us:.1f}" if us is not None else "failed")

    def fastest(candidates):
        return min(candidates, key=lambda c: c[1]) if candidates else None

    for run in runs:
        if "tuned nondet" not in run["config"] or not run.get("autotune"):
            continue
        printed = False
        for header, candidates in autotune_sections(run["autotune"]):
            if not header.startswith("cudnnConvolution") or not candidates:
                continue
            if not printed:
                print(f"convolution algorithms, {run['config']} {run['precision']} (median us):")
                printed = True
            deterministic = [c for c in candidates if "non-deterministic" not in c[0]]
            timed = [c for c in candidates if c[1] is not None]
            timed_deterministic = [c for c in deterministic if c[1] is not None]
            print(f"  {header[:96]}: default "
                  f"{named(deterministic[0] if deterministic else None)}, "
                  f"fastest deterministic {named(fastest(timed_deterministic))}, "
                  f"fastest {named(fastest(timed))}")


def profile_rows_ms(rows, patterns, steps):
    """Device ms per step of the kernel-profile rows that match one of `patterns`."""
    total = 0.0
    for row in rows:
        cells = row.split()
        if len(cells) > 4 and any(re.search(p, row) for p in patterns):
            try:
                total += float(cells[1])
            except ValueError:
                pass
    return total / steps


def kernel_profiles(runs):
    """The largest entries of each kernel profile (the whole tables are in train.json), and
    what they say of the step: launch- or device-bound, the amp budget, GEMMs against the
    project's own kernels."""
    for run in runs:
        table = run.get("kernel_profile")
        if not table:
            continue
        # The header, a row per kernel, the total row, then the host's time inside the calls.
        total_at = next((i for i, row in enumerate(table) if row.endswith("all timed launches")),
                        len(table) - 1)
        host_line = next((row for row in table if row.startswith("host time inside")), "")
        rows = table[1:total_at]
        print(f"device time per kernel, {run['config']} {run['precision']}: the 12 largest of "
              f"{len(rows)}")
        for row in table[:min(13, total_at)] + [table[total_at]]:
            print("  " + row[:170])
        # The kernels' device time per step (evaluation and the first step's set-up included,
        # so an upper bound) beside the untimed FP16 run's median step: a step much longer
        # than its kernels waits for the host (launch-bound), one close to it is bound by the
        # device. The host's time inside the launch calls says how much of such a wait they
        # explain.
        fields = table[total_at].split()
        steps = positive(run.get("summary", {}).get("steps"))
        base = run["config"].replace(" (kernels timed)", "")
        median = next((median_ms(r) for r in runs if r["config"] == base and
                       r["precision"] == "fp16" and r["status"] == "ok"), None)
        if len(fields) <= 1 or not steps or not median:
            continue
        try:
            per_step = float(fields[1]) / steps
            print(f"  kernels: {per_step:.2f} ms of device time per step (at most), "
                  f"against a median FP16 step of {median:.2f} ms "
                  f"({100 * per_step / median:.0f}%)")
            host_ms = float(host_line.split(":")[1].split()[0])
            print(f"  host: {host_ms / steps:.2f} ms per step inside the launch calls "
                  f"(kernels, cuBLASLt, cuDNN; profiled, so an upper bound)")
        except (ValueError, IndexError):
            pass
        # The amp budget: unscale + check, the scale's update and the optimizer
        # together within 5% of the step. Clipping and the widening of the 16-bit gradients
        # into the FP32 .grad (one widen_gradients launch per backward, and any cast into F32)
        # are shown beside it, not in it.
        amp = profile_rows_ms(rows, [r"launch_unscale", r"count_taken_step",
                                     r"launch_param_steps", r"update_loss_scale",
                                     r"loss_scale_factor"], steps)
        clip = profile_rows_ms(rows, [r"squared_norms", r"clip_by_total_norm"], steps)
        widen = profile_rows_ms(
            rows, [r"launch_cast \[with Src = [_a-z0-9]*(half|bfloat16); Dst = float",
                   r"kernels::widen_gradients"], steps)
        print(f"  amp: {amp:.3f} ms per step in unscale + check, scale update and optimizer "
              f"({100 * amp / median:.1f}% of the median step, target <= 5%); clipping "
              f"{clip:.3f} ms, 16-bit -> FP32 gradient widening {widen:.3f} ms")
        # Which side of the device time to work on: the libraries' GEMMs and convolutions, or
        # the project's own kernels (everything else).
        gemm = profile_rows_ms(rows, [r"\scublasLtMatmul "], steps)
        conv = profile_rows_ms(rows, [r"\scudnnConvolution"], steps)
        own = profile_rows_ms(rows, [r""], steps) - gemm - conv  # "" matches every row
        print(f"  split: {gemm:.2f} ms per step in cuBLASLt matmuls, {conv:.2f} ms in cuDNN "
              f"convolutions, {own:.2f} ms in the project's own kernels")


def train_table(train_json):
    runs = read_json(train_json)["runs"]
    train_rows(runs)
    convolution_choices(runs)
    kernel_profiles(runs)


# --- the comparison with PyTorch, and the targets -----------------------------------

def compare_table(compare_json, bench_json, fp16_peak):
    configs = read_json(compare_json)["configs"]
    targets = []  # (what, figure, target, met)
    print(f"{'mixprec against PyTorch eager':<44} median step (mixprec bench, torch_bench.py), "
          "same model, batch, GPU")
    for entry in configs:
        label = entry["config"]
        if entry["status"] != "ok":
            print(f"  {label:<42} {entry['status']}")
            continue
        ms = {(row.get("framework"), row.get("precision")): positive(row.get("median_step_ms"))
              for row in entry.get("rows", []) if positive(row.get("median_step_ms"))}

        def cell(framework, precision):
            value = ms.get((framework, precision))
            return f"{value:.3f}" if value else "n/a"

        def ratio(a, b):
            return a / b if a and b else None

        target_speedup = 2.5 if label.startswith("gpt") else 2.0
        line = f"  {label:<42} mixprec {cell('mixprec', 'fp32')} / {cell('mixprec', 'fp16')} ms"
        speedup = ratio(ms.get(("mixprec", "fp32")), ms.get(("mixprec", "fp16")))
        if speedup:
            line += f" (FP16 {speedup:.2f}x, target {target_speedup:g}x)"
            targets.append((f"{label}, FP16 over FP32", f"{speedup:.2f}x",
                            f">= {target_speedup:g}x", speedup >= target_speedup))
        line += f", torch {cell('torch', 'fp32')} / {cell('torch', 'fp16')} ms"
        versus = ratio(ms.get(("mixprec", "fp16")), ms.get(("torch", "fp16")))
        if versus:
            line += f", mixprec/torch FP16 {versus:.2f} (target <= 0.75)"
            targets.append((f"{label}, mixprec/torch FP16", f"{versus:.2f}", "<= 0.75",
                            versus <= 0.75))
        print(line)
    runs = benchmarks(bench_json)
    tflops = [positive(runs[name].get("TFLOP/s")) for name in FP16_GEMMS if name in runs]
    tflops = [value for value in tflops if value]
    if tflops:
        share = 100 * max(tflops) / fp16_peak
        targets.insert(0, ("GEMM 4096^3 FP16, share of the dense peak", f"{share:.1f}%",
                           ">= 70%", share >= 70))
    print(f"{'targets of the issue':<56} {'measured':>9}  {'target':<8} "
          "(the amp share: see each profile)")
    for what, figure, target, met in targets:
        print(f"  {what:<54} {figure:>9}  {target:<8} {'met' if met else 'MISSED'}")


COMMANDS = {
    "gather-train": (gather_train, [str, str]),
    "gather-compare": (gather_compare, [str, str]),
    "bench-table": (bench_table, [str, str, float, float]),
    "train-table": (train_table, [str]),
    "compare-table": (compare_table, [str, str, float]),
}


def main(argv):
    """Runs the command argv[1:] names; 2, with the usage, for one it does not know, a wrong
    count of arguments or a peak that is not a number."""
    command = COMMANDS.get(argv[1]) if len(argv) > 1 else None
    try:
        if command is None or len(argv) - 2 != len(command[1]):
            raise ValueError
        function, types = command
        arguments = [kind(text) for kind, text in zip(types, argv[2:])]
    except ValueError:
        print("usage:\n" + __doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    function(*arguments)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
