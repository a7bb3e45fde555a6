#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR from start to summary on a machine without a GPU, so that the
# one prepared run for a lent GPU is known to work before device time is spent on it.
#
#   bash tests/gpu_check/dry_run.sh MIXPREC_EMULATED CUDA_EMULATED_TESTS DATA_DIR
#
# A copy of scripts/ and configs/ gets a build-gpu/bin/ of stand-ins: `mixprec` is the CLI on
# the emulated CUDA runtime in host-only mode (MIXPREC_EMULATION_HOST_ONLY; the GPT made
# small enough for it), so the summaries, kernel profiles, tuning logs and bench.json files
# the script reads are the real ones; `mixprec_cuda_tests` is the emulated test binary, run
# on one test; `mixprec_bench_kernels`, torch_gemm.py, torch_bench.py and nvidia-smi are
# stand-ins that write what those programs write (stand_ins/). Fails, naming the line, when
# the run's exit status is not 0, when a row of the summary table is missing or did not run,
# or when OUTDIR holds other files than the eight the script promises.
set -euo pipefail

[[ $# -eq 3 ]] || { echo "usage: $0 MIXPREC_EMULATED CUDA_EMULATED_TESTS DATA_DIR" >&2; exit 2; }
emulated="$(readlink -f "$1")"
emulated_tests="$(readlink -f "$2")"
data_dir="$(readlink -f "$3")"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
stand_ins="${src}/tests/gpu_check/stand_ins"

work="$(mktemp -d /tmp/mixprec-gpu-check-dry-run.XXXXXX)"
trap 'rm -rf "${work}"' EXIT
root="${work}/repo"
mkdir -p "${root}/build-gpu/bin" "${work}/path"
cp -r "${src}/scripts" "${src}/configs" "${root}/"
cp "${stand_ins}/torch_gemm.py" "${stand_ins}/torch_bench.py" "${root}/scripts/"
cp "${stand_ins}/mixprec_bench_kernels" "${root}/build-gpu/bin/"
cp "${stand_ins}/nvidia-smi" "${work}/path/"
sed "s#@EMULATED@#${emulated}#" "${stand_ins}/mixprec.in" >"${root}/build-gpu/bin/mixprec"
printf '#!/usr/bin/env bash\nexec "%s" "$@"\n' "${emulated_tests}" \
  >"${root}/build-gpu/bin/mixprec_cuda_tests"
chmod +x "${root}/build-gpu/bin/"* "${work}/path/nvidia-smi"

out="${work}/out"
status=0
(
  cd "${root}"
  PATH="${work}/path:${PATH}" MIXPREC_DATA_DIR="${data_dir}" TMPDIR="${work}" \
    MIXPREC_GPU_TEST_FILTER="cuda indices copied in place over a whole tensor keep their bounds" \
    bash scripts/gpu_check.sh "${out}"
) >"${work}/run.log" 2>&1 || status=$?
summary="${out}/summary.txt"

failures=0
fail() {
  echo "FAILED: $*" >&2
  failures=$((failures + 1))
}
# Each pattern (an extended regular expression) must match `count` lines of the summary.
expect() {
  local count="$1" pattern="$2" found
  found="$(grep -cE -- "${pattern}" "${summary}" || true)"
  [[ "${found}" == "${count}" ]] || fail "${count} line(s) of summary.txt should match '${pattern}'; ${found} do"
}

(( status == 0 )) || fail "gpu_check.sh exited with ${status}"
if [[ ! -s "${summary}" ]]; then
  fail "no summary.txt"
else
  expect 1 '^CUDA tests .* 1 passed, 0 failed'
  expect 1 '^GEMM 4096\^3 FP16 +[0-9.]+ TFLOP/s'
  expect 2 '^torch\.mm 4096\^3 (FP16|BF16) +[0-9.]+ TFLOP/s'
  # The comparison with PyTorch, per config: both frameworks' steps and the targets' ratios.
  expect 2 '^  gpt_shakespeare_gpu( cuda_graph)? +mixprec .*FP16 [0-9.]+x, target 2\.5x.*mixprec/torch FP16 [0-9.]+ \(target <= 0\.75\)'
  expect 2 '^  cnn_fashion.*mixprec .*FP16 [0-9.]+x, target 2x.*mixprec/torch FP16 [0-9.]+ \(target <= 0\.75\)'
  expect 2 '^  [a-z_ A-Z]+ cuda_graph +mixprec '
  # The targets, each with its figure and whether it was met: the GEMM's share of the peak,
  # then FP16 over FP32 and mixprec over PyTorch for each of the four comparison runs.
  expect 1 '^targets of the issue'
  expect 9 '^  .+ +[0-9.]+[x%]? +(>=|<=) [0-9.]+[x%]? +(met|MISSED)$'
  expect 1 '^  GEMM 4096\^3 FP16, share of the dense peak +[0-9.]+% +>= 70% +(met|MISSED)$'
  # All 16 runs of the training stage ran (7 of the GPT, 9 of the CNN), none out of time.
  expect 16 '^train .* ms/step'
  expect 7 '^train gpt_shakespeare_gpu.* ms/step'
  expect 0 '^(train |  ).*(not run|timed out|exit [1-9]|no summary)'
  expect 2 '^train .* cuda_graph fp16 .* [0-9]+ recorded, [0-9]+ replayed +[0-9.]+x eager'
  expect 2 '^  amp: .* target <= 5%'
  expect 2 '^  split: '
  expect 2 '^convolution algorithms, cnn_fashion'
fi
files="$(cd "${out}" 2>/dev/null && ls | sort | paste -sd' ' -)"
[[ "${files}" == "bench.json bench.log compare.json env.log summary.txt tests.log torch.log train.json" ]] ||
  fail "OUTDIR holds '${files}'"

if (( failures > 0 )); then
  echo "---- run.log" >&2
  tail -n 60 "${work}/run.log" >&2
  echo "---- summary.txt" >&2
  cat "${summary}" >&2 2>/dev/null || true
  exit 1
fi
echo "gpu_check.sh dry run: summary table complete"
cat "${summary}"
