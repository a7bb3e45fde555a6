#!/usr/bin/env bash
# Sets up, builds and runs the main job: trains the CNN of configs/cnn_fashion.yaml on
# Fashion-MNIST in FP16 with dynamic loss scaling (3 epochs on the CPU, or on a GPU when one is
# usable), writing its run folder under runs/. Arguments replace the default command line of
# mixprec, e.g. `bash scripts/run.sh explain all`. It installs only what the main job needs
# (scripts/setup.sh) and builds only the mixprec CLI; scripts/test.sh builds the rest.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Set-up and build messages go to stderr, so that stdout holds only what mixprec prints.
bash "${root}/scripts/setup.sh" >&2
# The CUDA backend is built only where a GPU could run it: without one, the main job trains on
# the CPU, and compiling the CUDA backend would take most of its build time.
# (scripts/test.sh builds it whenever nvcc is there, so CI still compiles it.)
cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  cuda=AUTO
fi
bash "${root}/scripts/build.sh" "-DMIXPREC_CUDA=${cuda}" --target mixprec >&2
if [[ $# -eq 0 ]]; then
  cd "${root}"
  set -- train configs/cnn_fashion.yaml
fi
exec "${root}/build/apps/mixprec" "$@"
