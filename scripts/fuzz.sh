#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ into build-asan/ (scripts/sanitized_build.sh:
# clang, ASan and UBSan, -O1 with asserts, libFuzzer's coverage where the inputs reach) and runs
# each for MIXPREC_FUZZ_SECONDS seconds (default 10), MIXPREC_FUZZ_JOBS at a time (default:
# one per core), on a copy of its seeds, tests/fuzz/corpus/<target>/, in a temporary folder,
# so that the repository's corpus does not grow. What a target finds lands in
# build-asan/artifacts/<target>/; the script then exits non-zero naming the target and the
# file, which reproduces the finding when given to the target:
#   build-asan/tests/fuzz/<target> <file>
#
# MIXPREC_FUZZ_TARGETS="fuzz_idx fuzz_config" runs only those.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${root}/build-asan"
seconds="${MIXPREC_FUZZ_SECONDS:-10}"
all_targets="fuzz_config fuzz_idx fuzz_safetensors fuzz_state_json"
read -r -a targets <<< "${MIXPREC_FUZZ_TARGETS:-${all_targets}}"

# Longest input per target: a few times the largest seed, enough for every structure the
# reader knows while keeping each run fast. state.json seeds are real checkpoints (~5 KB).
max_len() {
  case "$1" in
    fuzz_state_json) echo 16384 ;;
    *) echo 4096 ;;
  esac
}

bash "${root}/scripts/sanitized_build.sh" "${targets[@]}"

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# One target: fuzz a copy of its seeds; its exit status and log go to ${work}.
run_target() {
  local target="$1" status=0
  local artifacts="${build_dir}/artifacts/${target}"
  mkdir -p "${artifacts}" "${work}/${target}"
  cp -R "${root}/tests/fuzz/corpus/${target}/." "${work}/${target}/"
  # Findings of this run are the artifact files newer than this marker.
  touch "${work}/${target}.start"
  # LeakSanitizer stays on (libFuzzer's -detect_leaks=1); -timeout is per input.
  "${build_dir}/tests/fuzz/${target}" -max_total_time="${seconds}" -rss_limit_mb=2048 \
    -timeout=10 -max_len="$(max_len "${target}")" -print_final_stats=1 \
    -artifact_prefix="${artifacts}/" "${work}/${target}" > "${work}/${target}.log" 2>&1 ||
    status=$?
  echo "${status}" > "${work}/${target}.status"
}

parallel="${MIXPREC_FUZZ_JOBS:-$(nproc)}"
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, ${parallel} at a time"
for target in "${targets[@]}"; do
  while [[ "$(jobs -rp | wc -l)" -ge "${parallel}" ]]; do wait -n || true; done
  run_target "${target}" &
done
wait

failed=()
for target in "${targets[@]}"; do
  status="$(cat "${work}/${target}.status" 2>/dev/null || echo "did not run")"
  found="$(find "${build_dir}/artifacts/${target}" -type f -newer "${work}/${target}.start" \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort)"
  echo "--- ${target} (exit ${status})"
  grep -E '^(#[0-9]+ +DONE|stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb))' \
    "${work}/${target}.log" || true
  if [[ "${status}" != 0 || -n "${found}" ]]; then
    grep -E -A 40 'ERROR: |runtime error|^fuzz_[a-z_]+( \(|:)' "${work}/${target}.log" \
      | head -n 80 || true
    failed+=("${target} (exit ${status}): ${found:-no artifact file; see its log above}")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: FAILED" >&2
  for line in "${failed[@]}"; do echo "  ${line}" >&2; done
  echo "fuzz: reproduce with build-asan/tests/fuzz/<target> <file>" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds} s each without findings"
