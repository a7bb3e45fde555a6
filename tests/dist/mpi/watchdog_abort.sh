#!/usr/bin/env bash
# Runs watchdog_abort.cpp's program under mpirun ("$@" is the mpirun command line with the
# program; the folder for the pids is appended) and checks that the hung collective ended
# every rank: mpirun exits non-zero well before the sleeping rank would have woken, rank 0
# printed the watchdog's one line, and no rank's process is left.
set -u
dir="$(mktemp -d)"
trap 'rm -rf "${dir}"' EXIT
fail() { echo "watchdog_abort: $*" >&2; exit 1; }

start="$(date +%s)"
"$@" "${dir}" >"${dir}/output" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
cat "${dir}/output"
echo "watchdog_abort: mpirun exited ${status} after ${elapsed} s"

[[ ${status} != 0 ]] || fail "mpirun exited 0"
((elapsed < 30)) || fail "the run took ${elapsed} s; the sleeping rank was not ended"
line='rank 0: collective barrier #3 at step 7 did not finish within 2 s; aborting every rank'
count="$(grep -cxF "${line}" "${dir}/output")"
[[ ${count} == 1 ]] || fail "expected the line '${line}' once, found it ${count} times"
grep -q 'did not finish' <(grep -v -xF "${line}" "${dir}/output") &&
  fail "another rank reported a timeout"
pids=("${dir}"/rank*.pid)
[[ ${#pids[@]} == 2 && -f ${pids[0]} ]] || fail "expected two pid files, found: ${pids[*]}"
for file in "${pids[@]}"; do
  pid="$(cat "${file}")"
  # A rank that has exited may stay a zombie until init reaps it: that one is gone too.
  state="$(ps -o stat= -p "${pid}" 2>/dev/null)"
  if [[ -n ${state} && ${state} != Z* ]]; then
    kill -9 "${pid}"
    fail "$(basename "${file}" .pid) (pid ${pid}) outlived mpirun"
  fi
done
echo "watchdog_abort: passed"
