#!/usr/bin/env bash
# Installs the Debian packages that the main job needs: what mixprec builds against, the
# Fashion-MNIST data set (dataset-fashion-mnist, files under /usr/share/datasets/fashion-mnist/)
# that it trains on, and gnuplot-nox, which draws the charts of `mixprec bench` and
# `mixprec inspect`. Open MPI (openmpi-bin for mpirun, libopenmpi-dev to build against) gives
# the data-parallel runs of dist/ and their tests; without it the build leaves them out.
# Protocol Buffers (libprotobuf-dev, protobuf-compiler) encode the TensorBoard event files
# every run writes. Catch2 and Google Benchmark are small header/library packages that the
# configure step looks for, so they are here too; the test-only packages (PyTorch, clang, the
# sanitizer and fuzzing runtimes) are installed by scripts/setup_tests.sh.
#
# `scripts/setup.sh PACKAGE...` installs those packages instead (setup_tests.sh uses it).
# Idempotent: when everything is already installed it only asks dpkg (no apt-get update), so
# it is cheap to run before every build. Needs root or sudo only when something is missing.
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
  openmpi-bin
  libopenmpi-dev
  libprotobuf-dev
  protobuf-compiler
  libbenchmark-dev
  dataset-fashion-mnist
  gnuplot-nox
)
if [[ $# -gt 0 ]]; then
  packages=("$@")
fi

missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "${package}" 2>/dev/null || true)"
  if [[ "${status}" != "install ok installed" ]]; then
    missing+=("${package}")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages are installed"
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
