#!/usr/bin/env bash
# slowest_compiles.sh N BUILD_DIR... : the N files that took longest to compile, from each
# build folder's .ninja_log (the latest build of each output), slowest first, then each
# folder's total compile time (CPU seconds, summed over its outputs). Folders without a log
# are left out.
set -euo pipefail

count="$1"
shift
rows="$(mktemp)"
trap 'rm -f "${rows}"' EXIT
for dir in "$@"; do
  [[ -f "${dir}/.ninja_log" ]] || continue
  # Columns: start ms, end ms, mtime, output, hash; a rebuilt output appears again later, so
  # the last line of an output wins. Libraries and executables are links, not compiles.
  awk -v dir="$(basename "${dir}")" '
    NR > 1 && $4 ~ /\.o$/ { t[$4] = ($2 - $1) / 1000 }
    END { for (o in t) printf "%8.1f  %s  %s\n", t[o], dir, o }' "${dir}/.ninja_log" >> "${rows}"
done
[[ -s "${rows}" ]] || exit 0
echo "slowest compiles (seconds):"
sort -rn "${rows}" | awk -v n="${count}" 'NR <= n'
awk '{ s[$2] += $1; n[$2]++ } END { for (d in s) printf "%8.1f  %s  (all %d objects)\n", s[d], d, n[d] }' \
  "${rows}"
