#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test. Exits non-zero on any failure.
# Tests tagged [cuda] report themselves as skipped (a warning) when no GPU is present.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

bash "${root}/scripts/setup.sh"
bash "${root}/scripts/build.sh"
ctest --test-dir "${root}/build" --output-on-failure -j "$(nproc)"
