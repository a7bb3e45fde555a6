#!/usr/bin/env bash
# Configures (once) and builds mixprec into build/ as a Release build. The CUDA backend is
# built when nvcc is found (MIXPREC_CUDA=AUTO). Extra arguments are passed to the configure
# step, e.g. `bash scripts/build.sh -DMIXPREC_CUDA=OFF`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${root}/build"
jobs="$(nproc)"

generator=()
# A build folder keeps the generator it was configured with; only choose one for a new folder.
if [[ ! -f "${build_dir}/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi

# Only the caller's options are passed: Release and MIXPREC_CUDA=AUTO are the defaults of
# CMakeLists.txt, and repeating them here would undo an option set by an earlier call.
cmake -S "${root}" -B "${build_dir}" "${generator[@]}" "$@"
cmake --build "${build_dir}" -j "${jobs}"
