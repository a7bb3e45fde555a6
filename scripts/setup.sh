#!/usr/bin/env bash
# Installs the Debian packages that mixprec builds against, the Fashion-MNIST data set
# (dataset-fashion-mnist, files under /usr/share/datasets/fashion-mnist/) that the main job
# trains on, and PyTorch for the CPU (python3-torch), which the checkpoint-compatibility test
# and the comparison scripts under scripts/ use, with OpenBLAS (libopenblas0-pthread) so that
# its matrix products do not fall back to the reference BLAS; gnuplot-nox, which draws the
# charts of `mixprec bench` and `mixprec inspect`; python3-yaml, with which the PyTorch
# benchmark script reads the same configs; clang, libclang-rt-14-dev (the libFuzzer and
# sanitizer runtimes) and libomp-dev (clang's OpenMP) for the fuzzing and sanitizer jobs. Idempotent: when everything is
# already installed it only asks dpkg (no apt-get update), so it is cheap to run before
# every build. Needs root or sudo only when something is missing.
set -euo pipefail

packages=(
  cmake
  g++
  make
  ninja-build
  libeigen3-dev
  libspdlog-dev
  libfmt-dev
  catch2
  libyaml-cpp-dev
  libcli11-dev
  nlohmann-json3-dev
  zlib1g-dev
  libbenchmark-dev
  dataset-fashion-mnist
  python3-torch
  python3-numpy
  libopenblas0-pthread
  gnuplot-nox
  python3-yaml
  clang
  libclang-rt-14-dev
  libomp-dev
)

missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "${package}" 2>/dev/null || true)"
  if [[ "${status}" != "install ok installed" ]]; then
    missing+=("${package}")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} build dependencies are installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if [[ "$(id -u)" -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: missing packages (${missing[*]}) and not root, and sudo is not available" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update
"${as_root[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
