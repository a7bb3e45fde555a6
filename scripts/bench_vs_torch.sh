#!/usr/bin/env bash
# Benchmarks one config in PyTorch and in mixprec and shows both frameworks' rows in one table:
# scripts/torch_bench.py writes <out>/torch/bench.json, then
# `mixprec bench CONFIG --out <out>/mixprec --compare <out>/torch/bench.json` trains the same
# config once per precision and prints the joined table (kept in <out>/mixprec/bench.json and
# bench.md).
#
#   scripts/bench_vs_torch.sh CONFIG [--out DIR] [ARGS...]
#   scripts/bench_vs_torch.sh configs/cnn_fashion.yaml --steps 40 --warmup 5
#
# ARGS go to both programs, so they are the options both understand: --steps N, --warmup N,
# --precisions LIST, --set key.path=value. TORCH_BENCH_ARGS adds options for the torch side
# only (e.g. TORCH_BENCH_ARGS="--threads 2"). DIR defaults to
# runs/<config file stem>-vs-torch-<date>-<time>.
#
# The mixprec binary is $MIXPREC, else build/apps/mixprec; python is $MIXPREC_PYTHON, else
# /usr/bin/python3 when it imports torch (Debian's python3-torch lives there), else python3.
#
# A precision torch cannot run on this device (fp16 on the CPU) is a "skipped" row of the torch
# bench.json; `mixprec bench --compare` takes rows with step times, so such rows are left out of
# the copy it reads (<out>/torch/compare.json) and torch's own table, printed first, names them.
#
# Exit status: 0 when both succeed, else that of the first that failed (2: bad input).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  echo "usage: $0 CONFIG [--out DIR] [--steps N] [--warmup N] [--precisions LIST]" \
       "[--set key.path=value ...]" >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
config="$1"
shift
[[ "${config}" != -* ]] || usage
out=""
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out)
      [[ $# -ge 2 ]] || usage
      out="$2"
      shift 2
      ;;
    --out=*)
      out="${1#--out=}"
      shift
      ;;
    *)
      args+=("$1")
      shift
      ;;
  esac
done
if [[ -z "${out}" ]]; then
  stem="$(basename "${config}")"
  out="runs/${stem%.*}-vs-torch-$(date +%Y%m%d-%H%M%S)"
fi

mixprec="${MIXPREC:-${root}/build/apps/mixprec}"
if [[ ! -x "${mixprec}" ]]; then
  echo "error: ${mixprec}: no mixprec binary there (build it with scripts/build.sh, or set" \
       "MIXPREC to its path)" >&2
  exit 2
fi
if [[ -n "${MIXPREC_PYTHON:-}" ]]; then
  python="${MIXPREC_PYTHON}"
elif /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  python=/usr/bin/python3
else
  python=python3
fi

# TORCH_BENCH_ARGS is split on blanks on purpose: it is a list of options.
# shellcheck disable=SC2206
torch_args=(${TORCH_BENCH_ARGS:-})
status=0
"${python}" "${root}/scripts/torch_bench.py" "${config}" --out "${out}/torch" \
  ${args[@]+"${args[@]}"} ${torch_args[@]+"${torch_args[@]}"} || status=$?
if [[ ${status} -ne 0 ]]; then
  echo "error: scripts/torch_bench.py failed (exit ${status}); mixprec bench not run" >&2
  exit "${status}"
fi

# The rows mixprec bench can compare: those with step times. Prints how many there are and how
# many were left out, and writes compare.json when some were.
compare="${out}/torch/bench.json"
summary="$("${python}" - "${compare}" "${out}/torch/compare.json" <<'EOF'
import json
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    bench = json.load(f)
rows = [r for r in bench["rows"] if "skipped" not in r]
skipped = len(bench["rows"]) - len(rows)
if skipped:
    bench["rows"] = rows
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(bench, f, indent=2)
        f.write("\n")
print(len(rows), skipped)
EOF
)"
read -r trained skipped <<<"${summary}"
compare_args=()
if [[ "${trained}" -eq 0 ]]; then
  echo "note: torch skipped every precision; mixprec bench runs without --compare" >&2
elif [[ "${skipped}" -eq 0 ]]; then
  compare_args=(--compare "${compare}")
else
  compare_args=(--compare "${out}/torch/compare.json")
fi

status=0
"${mixprec}" bench "${config}" --out "${out}/mixprec" ${compare_args[@]+"${compare_args[@]}"} \
  ${args[@]+"${args[@]}"} || status=$?
if [[ ${status} -ne 0 ]]; then
  echo "error: mixprec bench failed (exit ${status}); torch's rows are in" \
       "${out}/torch/bench.json" >&2
  exit "${status}"
fi
