#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test. Exits non-zero on any failure.
# Tests tagged [cuda] report themselves as skipped (a warning) when no GPU is present.
#
# After the main build's tests come the clang jobs: the unit tests again under AddressSanitizer
# and UBSan (scripts/sanitize.sh) and each libFuzzer target for a minute (scripts/fuzz.sh).
# `scripts/test.sh --quick` leaves those two out, for a fast local check; CI runs everything.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

bash "${root}/scripts/setup.sh"
bash "${root}/scripts/build.sh"
ctest --test-dir "${root}/build" --output-on-failure -j "$(nproc)"
if [[ "${quick}" == 1 ]]; then
  echo "test: --quick, sanitizer and fuzz jobs not run"
  exit 0
fi
bash "${root}/scripts/sanitize.sh"
bash "${root}/scripts/fuzz.sh"
