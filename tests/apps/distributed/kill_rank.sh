#!/usr/bin/env bash
# Starts `mpirun ... -np 2 MIXPREC train ARGS...`, waits for its first checkpoint, kills rank 1
# with SIGKILL and reports how the job ended, as key=value lines on stdout:
#   exit=<mpirun's exit code> seconds=<from the kill to mpirun's end> leftover=<rank processes
#   still alive one second later>
# or error=<why> when no rank 1 was found.
# Usage: kill_rank.sh RUN_DIR MPIRUN... -- MIXPREC ARGS...
set -uo pipefail
run_dir="$1"
shift
"$@" > "${run_dir}.out" 2> "${run_dir}.err" &
launcher=$!
for _ in $(seq 1 300); do
  compgen -G "${run_dir}/checkpoints/step_*" > /dev/null && break
  sleep 0.1
done
# The ranks of this run: processes of its command line with a rank in their environment.
ranks() {
  for pid in $(pgrep -f -- "--out ${run_dir}( |$)"); do
    local rank
    rank=$(tr '\0' '\n' < "/proc/${pid}/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [[ -n "${rank}" ]] && echo "${pid} ${rank}"
  done
}
victim=$(ranks | awk '$2 == 1 {print $1}')
if [[ -z "${victim}" ]]; then
  echo "error=no rank 1 process found"
  kill -9 "${launcher}" 2>/dev/null
  exit 1
fi
start=$(date +%s.%N)
kill -9 "${victim}"
wait "${launcher}"
code=$?
end=$(date +%s.%N)
sleep 1
leftover=$(ranks | wc -l)
echo "exit=${code} seconds=$(echo "${end} - ${start}" | bc) leftover=${leftover}"
