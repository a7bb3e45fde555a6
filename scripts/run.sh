#!/usr/bin/env bash
# Sets up, builds and runs the main job: for now every lesson on number formats and loss
# scaling, `mixprec explain all`. Arguments replace the default command line of mixprec.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Set-up and build messages go to stderr, so that stdout holds only what mixprec prints.
bash "${root}/scripts/setup.sh" >&2
bash "${root}/scripts/build.sh" >&2
if [[ $# -eq 0 ]]; then
  set -- explain all
fi
exec "${root}/build/apps/mixprec" "$@"
