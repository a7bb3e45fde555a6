#!/usr/bin/env bash
# Installs what only the tests need, on top of scripts/setup.sh's packages: PyTorch for the
# CPU (python3-torch, python3-numpy) for the checkpoint-compatibility test and the comparison
# scripts under scripts/, with OpenBLAS (libopenblas0-pthread) so that its matrix products do
# not fall back to the reference BLAS, and python3-yaml, with which those scripts read the
# configs; clang, libclang-rt-14-dev (the libFuzzer and sanitizer runtimes) and libomp-dev
# (clang's OpenMP) for the sanitizer and fuzzing jobs; and PyPI's tensorboard, in a venv
# under ${XDG_CACHE_HOME:-~/.cache}/mixprec/, for the tests that read the runs' event files
# back with TensorBoard's own reader. Idempotent, like setup.sh. Without network the
# tensorboard install is reported and left out (those tests then skip with a message), and
# the set-up still succeeds.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

bash "${root}/scripts/setup.sh"
bash "${root}/scripts/setup.sh" python3-torch python3-numpy libopenblas0-pthread python3-yaml \
  clang libclang-rt-14-dev libomp-dev

tensorboard_venv="${XDG_CACHE_HOME:-${HOME}/.cache}/mixprec/tensorboard-venv"
tensorboard_version=2.21.0
if "${tensorboard_venv}/bin/python" -c \
    "import tensorboard, sys; sys.exit(tensorboard.__version__ != '${tensorboard_version}')" \
    2>/dev/null; then
  echo "setup_tests: tensorboard ${tensorboard_version} is installed in ${tensorboard_venv}"
else
  bash "${root}/scripts/setup.sh" python3-venv
  # Debian's python (12: 3.11), whose numpy the venv takes instead of downloading its own.
  if /usr/bin/python3 -m venv --system-site-packages "${tensorboard_venv}" &&
      "${tensorboard_venv}/bin/pip" install --quiet --disable-pip-version-check --timeout 20 \
        --retries 1 "tensorboard==${tensorboard_version}"; then
    echo "setup_tests: installed tensorboard ${tensorboard_version} in ${tensorboard_venv}"
  else
    echo "setup_tests: could not install tensorboard from PyPI (offline?); the tests that" \
      "read event files with TensorBoard's reader will skip" >&2
  fi
fi
