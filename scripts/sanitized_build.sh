#!/usr/bin/env bash
# Configures and builds build-asan/, the one clang build that both scripts/sanitize.sh
# (the unit tests) and scripts/fuzz.sh (the libFuzzer targets) use, so that the libraries are
# compiled with the sanitizers only once:
# - ASan, LeakSanitizer and UBSan in everything (MIXPREC_SANITIZE=ON);
# - the tests and the libFuzzer targets (MIXPREC_FUZZ=ON; libFuzzer's coverage goes only into
#   the libraries the targets' inputs reach, see tests/fuzz/CMakeLists.txt);
# - -O1 without NDEBUG: instrumented code compiles much faster than at -O2, and asserts stay
#   on; the tests' own code and the CLI's take -O0 (tests/CMakeLists.txt, apps/CMakeLists.txt);
#   line tables only (-gline-tables-only), which is all a sanitizer's stack trace needs for
#   file and line, and compiles faster than full debug information;
# - no CUDA backend but its CPU emulation, whose kernels then run under the sanitizers; no
#   benchmarks.
# Arguments name the targets to build; without any, everything is built.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${root}/build-asan"

generator=()
if [[ ! -f "${build_dir}/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
cmake -S "${root}" -B "${build_dir}" "${generator[@]}" \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DMIXPREC_SANITIZE=ON -DMIXPREC_FUZZ=ON -DMIXPREC_CUDA=OFF -DMIXPREC_BUILD_BENCH=OFF \
  -DMIXPREC_BUILD_TESTS=ON

targets=()
if [[ $# -gt 0 ]]; then
  targets=(--target "$@")
fi
cmake --build "${build_dir}" -j "$(nproc)" "${targets[@]}"
