#!/usr/bin/env python3
"""scripts/gpu_check_report.py on made-up stage outputs: the cases a GPU run can leave that the
dry run (tests/gpu_check/dry_run.sh, every stage succeeding) does not show. Failed and missing
runs keep their status, figures that are not finite positive numbers print as missing instead
of entering a ratio, the issue's targets are met exactly at their bounds, and the GEMM's share
is the better of the heuristic's and the tuned plan.

  python3 tests/gpu_check/report_test.py
"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
import gpu_check_report as report  # noqa: E402


def printed(function, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        function(*args)
    return out.getvalue().splitlines()


def bench_row(framework, precision, ms):
    return {"framework": framework, "precision": precision, "median_step_ms": ms}


class Folder(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def write_json(self, name, value):
        with open(self.path(name), "w") as f:
            json.dump(value, f)
        return self.path(name)

    def write_text(self, name, text):
        with open(self.path(name), "w") as f:
            f.write(text)
        return self.path(name)


class Numbers(unittest.TestCase):
    def test_only_finite_positive_numbers_count(self):
        for value in (1, 0.5, 3e8):
            self.assertEqual(report.positive(value), value)
        for value in (0, -1.0, float("nan"), float("inf"), None, "2.0", True, [1]):
            self.assertIsNone(report.positive(value), value)
        self.assertEqual(report.number(-2.5), -2.5)
        self.assertEqual(report.number(0), 0)
        self.assertIsNone(report.number(float("-inf")))


class CompareTable(Folder):
    def table(self, configs, benchmarks=None):
        compare = self.write_json("compare.json", {"configs": configs})
        bench = self.path("bench.json")
        if benchmarks is not None:
            self.write_json("bench.json", {"benchmarks": benchmarks})
        return printed(report.compare_table, compare, bench, 1000.0)

    def targets(self, lines):
        start = next(i for i, line in enumerate(lines) if line.startswith("targets of the issue"))
        return [line.split() for line in lines[start + 1:]]

    def test_targets_are_met_at_their_bounds_and_missed_past_them(self):
        lines = self.table([
            {"config": "gpt_shakespeare_gpu", "status": "ok",
             "rows": [bench_row("mixprec", "fp32", 25.0), bench_row("mixprec", "fp16", 10.0),
                      bench_row("torch", "fp16", 13.0)]},
            {"config": "cnn_fashion", "status": "ok",
             "rows": [bench_row("mixprec", "fp32", 2.98), bench_row("mixprec", "fp16", 1.5),
                      bench_row("torch", "fp16", 2.0)]},
        ])
        self.assertIn("(FP16 2.50x, target 2.5x)", lines[1])
        self.assertIn("mixprec/torch FP16 0.77 (target <= 0.75)", lines[1])
        self.assertIn("torch n/a / 13.000 ms", lines[1])  # no FP32 row of PyTorch's
        got = [(words[-1], words[-4]) for words in self.targets(lines)]
        self.assertEqual(got, [("met", "2.50x"), ("MISSED", "0.77"), ("MISSED", "1.99x"),
                               ("met", "0.75")])

    def test_a_run_that_failed_or_has_no_usable_figure_sets_no_target(self):
        lines = self.table([
            {"config": "gpt_shakespeare_gpu", "status": "timed out after 60 s"},
            {"config": "cnn_fashion", "status": "ok",
             "rows": [bench_row("mixprec", "fp32", float("nan")),
                      bench_row("mixprec", "fp16", 0.0), bench_row("torch", "fp16", -1.0)]},
        ])
        self.assertRegex(lines[1], r"^  gpt_shakespeare_gpu +timed out after 60 s$")
        self.assertIn("mixprec n/a / n/a ms, torch n/a / n/a ms", lines[2])
        self.assertNotIn("target", lines[2])
        self.assertEqual(self.targets(lines), [])

    def test_the_gemm_share_is_the_better_plan_and_skips_bad_counters(self):
        gemm = "BM_CudaGemm/F16/4096/manual_time"
        tuned = "BM_CudaGemmTuned/F16/4096/manual_time"
        lines = self.table([], [{"name": gemm, "TFLOP/s": 650.0},
                                {"name": tuned, "TFLOP/s": 702.0}])
        self.assertEqual(self.targets(lines)[0][-4:], ["70.2%", ">=", "70%", "met"])
        lines = self.table([], [{"name": gemm, "TFLOP/s": 699.0},
                                {"name": tuned, "TFLOP/s": float("inf")}])
        self.assertEqual(self.targets(lines)[0][-4:], ["69.9%", ">=", "70%", "MISSED"])
        lines = self.table([], [{"name": gemm, "TFLOP/s": 700.0}])
        self.assertEqual(self.targets(lines)[0][-4:], ["70.0%", ">=", "70%", "met"])
        lines = self.table([], [{"name": tuned, "error_occurred": True}])
        self.assertEqual(self.targets(lines), [])


def train_run(config, precision, status="ok", **summary):
    run = {"config": config, "precision": precision, "status": status}
    if summary:
        run["summary"] = summary
    return run


class TrainTable(Folder):
    def table(self, runs):
        return printed(report.train_table, self.write_json("train.json", {"runs": runs}))

    def test_speed_ups_against_fp32_and_against_the_eager_run(self):
        lines = self.table([
            train_run("cnn", "fp32", median_step_ms=3.0, samples_per_s=100.0),
            train_run("cnn", "fp16", median_step_ms=1.5, samples_per_s=200.0, val_loss=0.5,
                      host_syncs_per_step=0.25, skipped_steps=2),
            train_run("cnn cuda_graph", "fp16", median_step_ms=0.5, samples_per_s=600.0,
                      cuda_graph={"recordings": 3, "replays": 97}),
        ])
        self.assertRegex(lines[2], r"^train cnn fp16 +1\.50 ms/step +200 samples/s  val_loss "
                                   r"0\.500  2 skipped  0\.25 syncs/step  2\.00x FP32$")
        self.assertTrue(lines[3].endswith("3 recorded, 97 replayed  3.00x eager"), lines[3])
        self.assertIn("val_loss n/a", lines[3])

    def test_failed_runs_keep_their_status_and_bad_figures_make_no_ratio(self):
        lines = self.table([
            train_run("gpt", "fp32", "not run: out of time"),
            train_run("gpt", "fp16", median_step_ms=float("nan"), tokens_per_s=float("inf")),
            train_run("gpt", "bf16"),
            train_run("gpt cuda_graph", "fp16", median_step_ms=2.0,
                      cuda_graph={"recordings": 1, "replays": 9}),
        ])
        self.assertRegex(lines[1], r"^train gpt fp32 +not run: out of time$")
        self.assertRegex(lines[2], r"^train gpt fp16 +n/a ms/step +n/a tokens/s +val_loss n/a$")
        self.assertNotIn("x FP32", lines[2])
        self.assertRegex(lines[3], r"^train gpt bf16 +no summary\.json$")
        self.assertTrue(lines[4].endswith("1 recorded, 9 replayed"), lines[4])

    def test_a_kernel_profile_gives_the_step_split_and_the_amp_share(self):
        profile = [
            "share  total_ms  calls  mean_us  host_us  grid  kernel",
            "  40.00%  8.000  30  1.0  0.5  -  cublasLtMatmul 64x256x384 F16",
            "  30.00%  6.000  30  1.0  0.5  -  cudnnConvolutionForward 512x1x28x28",
            "  20.00%  4.000  30  1.0  0.5  1x256  unscale_kernel (kernels::launch_unscale)",
            "  10.00%  2.000  30  1.0  0.5  1x256  clip_kernel (kernels::clip_by_total_norm)",
            "  100.00%  20.000  120  all timed launches",
            "host time inside the calls: 5.0 ms",
        ]
        lines = self.table([
            train_run("gpt", "fp16", median_step_ms=1.0),
            dict(train_run("gpt (kernels timed)", "fp16", median_step_ms=9.0, steps=10),
                 kernel_profile=profile),
        ])
        text = "\n".join(lines)
        self.assertIn("the 12 largest of 4", text)
        self.assertIn("kernels: 2.00 ms of device time per step (at most), against a median "
                      "FP16 step of 1.00 ms (200%)", text)
        self.assertIn("host: 0.50 ms per step inside the launch calls", text)
        self.assertIn("amp: 0.400 ms per step in unscale + check, scale update and optimizer "
                      "(40.0% of the median step, target <= 5%); clipping 0.200 ms", text)
        self.assertIn("split: 0.80 ms per step in cuBLASLt matmuls, 0.60 ms in cuDNN "
                      "convolutions, 0.60 ms in the project's own kernels", text)

    def test_convolution_choices_name_the_default_and_the_fastest(self):
        log = [
            "cudnnConvolutionForward 512x1x28x28 F16",
            "  IMPLICIT_GEMM, tensor op math  median 30.0 us  (chosen)",
            "  FFT, non-deterministic  median 10.0 us",
            "  WINOGRAD, tensor op math  failed",
            "  IMPLICIT_PRECOMP_GEMM, tensor op math  median 20.0 us",
            "cublasLtMatmul 64x256x384",
            "  heuristic 0  median 5.0 us",
        ]
        lines = self.table([dict(train_run("cnn tuned nondet", "fp16", median_step_ms=1.0),
                                 autotune=log)])
        self.assertEqual(lines[2], "convolution algorithms, cnn tuned nondet fp16 (median us):")
        self.assertEqual(lines[3], "  cudnnConvolutionForward 512x1x28x28 F16: default "
                                   "IMPLICIT_GEMM 30.0, fastest deterministic "
                                   "IMPLICIT_PRECOMP_GEMM 20.0, fastest FFT 10.0")
        self.assertEqual(len(lines), 4)  # the matmul's log is not a convolution's


class BenchTable(Folder):
    def test_rows_not_run_failed_and_without_their_counter(self):
        bench = self.write_json("bench.json", {"benchmarks": [
            {"name": "BM_CudaGemm/F16/4096/manual_time", "TFLOP/s": 500.0},
            {"name": "BM_CudaGemm/BF16/4096/manual_time", "error_occurred": True,
             "error_message": "no CUDA device"},
            {"name": "BM_CudaAdd/F16/25000000/manual_time", "GB/s": float("nan")},
            {"name": "BM_CudaAmpStep/manual_time", "us/step": 400.0},
            {"name": "BM_CudaAdd/F32/25000000/manual_time", "GB/s": 0.0},
            {"name": "BM_ImageBatch/1/real_time", "real_time": float("nan"), "time_unit": "us"},
            {"name": "BM_ImageBatch/4/real_time", "real_time": 250.4, "time_unit": "us"},
        ]})
        train = self.write_json("train.json", {"runs": [
            train_run("gpt_shakespeare_gpu", "fp16", median_step_ms=8.0)]})
        lines = printed(report.bench_table, bench, train, 1000.0, 4800.0)
        row = {line[:report.LABEL].strip(): line[report.LABEL:].strip() for line in lines}
        self.assertEqual(row["GEMM 4096^3 FP16"], "500.0 TFLOP/s   50.0% of 1000 FP16 peak")
        self.assertEqual(row["GEMM 4096^3 BF16"], "error: no CUDA device")
        self.assertEqual(row["add 25M FP16"], "no GB/s counter")
        self.assertEqual(row["add 25M FP32"], "no GB/s counter")  # 0 GB/s is no figure
        self.assertEqual(row["CNN batch of 512 built, 1 thread"], "no real_time")
        self.assertEqual(row["CNN batch of 512 built, 4 threads"], "250 us/batch on the host")
        self.assertEqual(row["c_fc+gelu fwd+bwd, composed"], "not run")
        self.assertEqual(row["amp + AdamW tail, GPT, FP16"],
                         "400 us/step    5.0% of the 8.00 ms FP16 GPT step")
        self.assertEqual(len(lines), len(report.BENCH_ROWS))


class Gather(Folder):
    def test_train_runs_carry_what_their_files_hold(self):
        run_dir = self.path("gpt-fp16")
        os.mkdir(run_dir)
        self.write_json("gpt-fp16/summary.json", {"median_step_ms": 1.0})
        log = self.write_text("gpt-fp16.log", "".join(f"line {i}\n" for i in range(30)))
        self.write_text("gpt-fp16.autotune.txt", "problem\n  candidate  median 1.0 us\n")
        profile = self.write_text("kernels.txt", "header\nrow\n")
        tsv = self.write_text("runs.tsv",
                              f"gpt\tfp16\tok\t{run_dir}\t{log}\t{profile}\n"
                              "gpt\tfp32\tnot run: out of time\t\t\t\n"
                              f"gpt\tbf16\texit 1\t{self.path('gone')}\t"
                              f"{self.path('gone.log')}\t\n")
        report.gather_train(tsv, self.path("train.json"))
        with open(self.path("train.json")) as f:
            runs = json.load(f)["runs"]
        self.assertEqual(runs[0]["summary"], {"median_step_ms": 1.0})
        self.assertEqual(runs[0]["output_tail"], [f"line {i}" for i in range(10, 30)])
        self.assertEqual(runs[0]["autotune"], ["problem", "  candidate  median 1.0 us"])
        self.assertEqual(runs[0]["kernel_profile"], ["header", "row"])
        self.assertEqual(runs[1], {"config": "gpt", "precision": "fp32",
                                   "status": "not run: out of time"})
        self.assertEqual(runs[2], {"config": "gpt", "precision": "bf16", "status": "exit 1"})

    def test_compare_rows_come_only_from_runs_that_ended_well(self):
        bench = self.write_json("bench.json", {"rows": [bench_row("mixprec", "fp16", 1.0)]})
        tsv = self.write_text("runs.tsv", f"gpt\tok\t{bench}\ncnn\texit 2\t{bench}\n"
                                          f"cnn cuda_graph\tok\t{self.path('none.json')}\n")
        report.gather_compare(tsv, self.path("compare.json"))
        with open(self.path("compare.json")) as f:
            configs = json.load(f)["configs"]
        self.assertEqual(configs, [
            {"config": "gpt", "status": "ok", "rows": [bench_row("mixprec", "fp16", 1.0)]},
            {"config": "cnn", "status": "exit 2"},
            {"config": "cnn cuda_graph", "status": "ok"}])


class CommandLine(unittest.TestCase):
    def test_a_wrong_command_or_count_is_refused_with_the_usage(self):
        for argv in (["report"], ["report", "nonsense"], ["report", "train-table"],
                     ["report", "compare-table", "a", "b"]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(report.main(argv), 2)
            self.assertIn("gather-train RUNS_TSV TRAIN_JSON", err.getvalue())


if __name__ == "__main__":
    unittest.main()
