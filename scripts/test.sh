#!/usr/bin/env bash
# Installs the dependencies (scripts/setup_tests.sh), builds, and runs every test. Exits
# non-zero on any failure. Tests tagged [cuda] report themselves as skipped (a warning) when no
# GPU is present.
#
# After the main build's tests come the clang jobs: the unit tests again under AddressSanitizer
# and UBSan (scripts/sanitize.sh) and each libFuzzer target (scripts/fuzz.sh).
# `scripts/test.sh --quick` leaves those two out, for a fast local check; CI runs everything.
# At the end (also after a failure) it prints each phase's wall time and the ten slowest files
# to compile, so that a slower build shows in every CI log.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

phases=()
# Runs "$@" as the phase named $1 and records its wall time.
phase() {
  local name="$1" start status=0
  shift
  start="$(date +%s)"
  "$@" || status=$?
  phases+=("$(printf '%-22s %5d s%s' "${name}" "$(($(date +%s) - start))" \
    "$([[ ${status} == 0 ]] || echo "  (failed, exit ${status})")")")
  return "${status}"
}

report() {
  local total=0 line
  echo
  echo "test.sh: phase times"
  for line in "${phases[@]}"; do echo "  ${line}"; done
  echo "  $(printf '%-22s %5d s' total "$(($(date +%s) - script_start))")"
  bash "${root}/scripts/slowest_compiles.sh" 10 "${root}/build" "${root}/build-asan" || true
}
script_start="$(date +%s)"
trap report EXIT

phase setup bash "${root}/scripts/setup_tests.sh"
# AUTO: the CUDA backend and its tests are compiled whenever nvcc is there, also after
# scripts/run.sh configured build/ without them on a machine with no GPU.
# Without a GPU the CUDA code is compiled only to check it, so for one architecture (the lent
# GPUs' sm_90) instead of CMakeLists.txt's two, which halves nvcc's time.
cuda_archs=()
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
  cuda_archs=(-DCMAKE_CUDA_ARCHITECTURES=90)
fi
phase build bash "${root}/scripts/build.sh" -DMIXPREC_CUDA=AUTO ${cuda_archs[@]+"${cuda_archs[@]}"}
phase tests ctest --test-dir "${root}/build" --output-on-failure -j "$(nproc)"
if [[ "${quick}" == 1 ]]; then
  echo "test: --quick, sanitizer and fuzz jobs not run"
  exit 0
fi
phase sanitize bash "${root}/scripts/sanitize.sh"
phase fuzz bash "${root}/scripts/fuzz.sh"
