#!/usr/bin/env bash
# Builds the unit tests into build-asan/ with AddressSanitizer, LeakSanitizer and UBSan
# (scripts/sanitized_build.sh says how) and runs them with ctest. Any report fails the test
# that triggered it: ASan aborts, UBSan halts on the first error.
# Extra arguments go to ctest, e.g. `bash scripts/sanitize.sh -R safetensors`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${root}/build-asan"

bash "${root}/scripts/sanitized_build.sh"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Left out:
# - "cnn_fashion learns for 200 steps ...": 600 training steps on Fashion-MNIST take 160 s
#   under ASan, half of all the tests' time; the shorter trainings (resume, interrupt,
#   inject_nonfinite, torch checks) run the same code.
# - "the peak-memory probe sees 64 MiB ...": it asserts that freed memory leaves the process,
#   which ASan's quarantine of freed blocks prevents by design.
# - "emulated:cuda: the CNN/GPT config trains on cuda:0 ...": 10 steps of each config per
#   precision on the emulated CUDA backend; every kernel and library call they make is also in
#   the shorter emulated agreement tests, which do run here.
# - "the GPU GPT config trains a step on the CPU": a step of the full-size GPT config, 28 s
#   under ASan; the smaller GPT runs (resume, host reads, interrupt) go through the same code.
# - "torch check: ..." and "torch bench: ...": their work is PyTorch's, in Python, which the
#   sanitizers do not watch; the checkpoints they read are written by the resume tests too.
# - "resume: fp32 and bf16 with accumulation ..." and "interrupt: SIGINT stops at a step ...":
#   13 and 15 s under ASan; their code runs in "resume: fp16 with accumulation and a skipped
#   step" and "interrupt: SIGTERM during checkpointed steps", which do run here.
# - "emulated:gpu_check_dry_run": it checks scripts/gpu_check.sh's flow and tables; the CLI
#   runs it makes go through the code the other emulated tests run.
# - "gpu_check_report": Python only, nothing the sanitizers watch.
# - "mpirun -np 2: cnn_fashion in FP16 ...": four trainings of the CNN under ASan; the GPT
#   test beside it runs the same data-parallel step, and the batch-norm replay is host code
#   that the Release tests check bit for bit.
# - "mpirun -np 3 and -np 4 ...", "mpirun -np 2 mixprec bench ..." and "a rank killed
#   mid-run ...": the same data-parallel code as the two-rank GPT test, which runs here, at
#   other rank counts, through bench, and ended by mpirun from outside.
# - "emulated:op table: CUDA forward and backward ...", "emulated:cuda batch_norm forward
#   matches ..." and "... backward matches ...", and "emulated:cuda: train.cuda_graph replays
#   steps of two microbatches ...": 55, 22, 28 and 17 s under ASan, a quarter of the job's
#   test time, mostly in the tests' own -O0 reference loops. Every kernel they launch also
#   runs here in the per-op emulated agreement tests, the emulated CNN runs (batch norm) and
#   the other recorded-step tests.
skip='^(emulated:op table: CUDA forward|emulated:cuda batch_norm (forward|backward) matches|emulated:cuda: train.cuda_graph replays steps of two microbatches|cnn_fashion learns for 200 steps|mpirun -np 2: cnn_fashion in FP16|mpirun -np 3 and -np 4|mpirun -np 2 mixprec bench|a rank killed mid-run|the peak-memory probe sees 64 MiB|emulated:cuda: the (CNN|GPT) config trains|emulated:gpu_check_dry_run|gpu_check_report$|the GPU GPT config trains a step on the CPU|torch (check|bench): |resume: fp32 and bf16 with accumulation|interrupt: SIGINT stops at a step)'
ctest --test-dir "${build_dir}" --output-on-failure -j "$(nproc)" -E "${skip}" "$@"
