#!/usr/bin/env bash
# Installs what only the tests need, on top of scripts/setup.sh's packages: PyTorch for the
# CPU (python3-torch, python3-numpy) for the checkpoint-compatibility test and the comparison
# scripts under scripts/, with OpenBLAS (libopenblas0-pthread) so that its matrix products do
# not fall back to the reference BLAS, and python3-yaml, with which those scripts read the
# configs; clang, libclang-rt-14-dev (the libFuzzer and sanitizer runtimes) and libomp-dev
# (clang's OpenMP) for the sanitizer and fuzzing jobs. Idempotent, like setup.sh.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

bash "${root}/scripts/setup.sh"
bash "${root}/scripts/setup.sh" python3-torch python3-numpy libopenblas0-pthread python3-yaml \
  clang libclang-rt-14-dev libomp-dev
