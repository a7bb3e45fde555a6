#!/usr/bin/env bash
# Configures (once) and builds mixprec into build/ as a Release build. The CUDA backend is
# built when nvcc is found (MIXPREC_CUDA=AUTO). `--target NAME` (repeatable) builds only
# those targets, e.g. `--target mixprec` for the CLI alone; every other argument goes to the
# configure step, e.g. `bash scripts/build.sh -DMIXPREC_CUDA=OFF`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${root}/build"
jobs="$(nproc)"

configure_args=()
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --target)
      [[ $# -ge 2 ]] || { echo "build.sh: --target needs a name" >&2; exit 2; }
      targets+=(--target "$2")
      shift 2 ;;
    *) configure_args+=("$1"); shift ;;
  esac
done

generator=()
# A build folder keeps the generator it was configured with; only choose one for a new folder.
if [[ ! -f "${build_dir}/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
# ccache, when installed, makes a rebuild of unchanged sources cheap; it is never required.
launcher=()
if command -v ccache >/dev/null 2>&1 && [[ ! -f "${build_dir}/CMakeCache.txt" ]]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

# Only the caller's options are passed: Release and MIXPREC_CUDA=AUTO are the defaults of
# CMakeLists.txt, and repeating them here would undo an option set by an earlier call.
cmake -S "${root}" -B "${build_dir}" "${generator[@]}" "${launcher[@]}" \
  ${configure_args[@]+"${configure_args[@]}"}
cmake --build "${build_dir}" -j "${jobs}" ${targets[@]+"${targets[@]}"}
