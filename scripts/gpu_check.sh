#!/usr/bin/env bash
# The one prepared run for a lent GPU machine (an H200, sm_90; see the project's GPU notes).
# Device time is short and the machine reaches no package registry, so the work is split:
#
#   bash scripts/gpu_check.sh --prepare      here: build with CUDA and stage build-gpu/
#   bash scripts/gpu_check.sh OUTDIR         there, from the repository root, build-gpu/ carried
#
# --prepare configures and builds in build-gpu-cmake/ (kept between runs so that a rebuild is
# incremental) and stages into build-gpu/ only what the run needs: bin/ (mixprec,
# mixprec_cuda_tests, mixprec_bench_kernels) and lib/ (the host libraries the binaries load
# apart from glibc and the CUDA libraries, used only if the machine lacks them). It prints the
# size, which must stay well under the 64 MiB that may be carried.
#
# OUTDIR: prints `nvidia-smi -L` and `ldd` of the binaries, puts the CUDA libraries of the
# machine (cuDNN and cuBLAS from PyTorch's nvidia-* wheels, the toolkit's lib64) on
# LD_LIBRARY_PATH, checks that the binaries start (else builds there from the sources when
# the dependencies exist, or says what is missing and stops), runs the CUDA tests, the CUDA
# kernel benchmarks, PyTorch's torch.mm at the GEMM benchmark's shape (scripts/torch_gemm.py),
# PyTorch eager against mixprec on the same model, batch and GPU (scripts/bench_vs_torch.sh,
# which runs scripts/torch_bench.py, autocast + GradScaler, and `mixprec bench`, for the GPU
# GPT config and the CNN config in FP32 and FP16, and `mixprec bench` again with
# train.cuda_graph), then a short training stage (`mixprec train` of the GPU GPT config and of the
# CNN config, FP32 and FP16 each, FP16 again with train.host_reads=per_step, FP16 again
# with train.cuda_graph (the step recorded as a CUDA graph and replayed), FP32 and FP16
# again with the GEMM (and for the CNN the convolution) algorithms autotuned, and a short FP16
# run of each with every kernel timed, MIXPREC_KERNEL_PROFILE, whose tables go into
# train.json and whose largest rows into the summary; the tuned runs' MIXPREC_AUTOTUNE_LOG
# logs go into train.json too, and each convolution's default, fastest deterministic and
# fastest algorithm into the summary), and prints a summary table last. Every step runs
# under `timeout`; the whole run stays under 8 minutes. Logs (8 files, all that may come back
# from the machine) go to OUTDIR: env.log (with the build's output when it had to build),
# tests.log, bench.log, bench.json, torch.log (torch_gemm.py's output, then bench_vs_torch.sh's),
# compare.json (the joined rows of each comparison), train.json (each training run's
# summary.json and the end of its output), summary.txt.
#
# Data: --prepare copies tiny shakespeare and MNIST's test set into build-gpu/data, and the
# run points MIXPREC_DATA_DIR there unless it is set. The training stage and the end-to-end
# CUDA tests look for them in $MIXPREC_DATA_DIR, then the repository's shared/data, then the
# shared/data beside the repository, and for Fashion-MNIST in
# /usr/share/datasets/fashion-mnist (MNIST's test set stands in for it when it is absent). A run whose data is missing is reported as such.
#
# Exit status: 0 when the tests passed and the benchmarks ran; 1 when a test failed or a step
# failed or timed out; 2 for bad usage or a failed --prepare; 3 when the binaries cannot run
# and cannot be rebuilt there; 4 when there is no usable CUDA device.
#
# Environment: MIXPREC_JOBS (parallel jobs of --prepare, default 2),
# MIXPREC_GPU_TEST_FILTER (Catch2 test spec, default: every test of mixprec_cuda_tests),
# MIXPREC_GPU_SKIP_TORCH=1 (skip the PyTorch steps), MIXPREC_GPU_SKIP_TRAIN=1 (skip the
# training stage), MIXPREC_DATA_DIR (see Data). tests/gpu_check/dry_run.sh runs the whole
# script on a machine without a GPU, with stand-ins for the GPU binaries and for PyTorch.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
payload="${root}/build-gpu"
# The JSON files and the summary's tables are written by this script's Python half.
report="${root}/scripts/gpu_check_report.py"
tree="${root}/build-gpu-cmake"
binaries=(mixprec mixprec_cuda_tests mixprec_bench_kernels)
# What may be carried in all; --prepare refuses a payload above the second figure.
carry_limit_mib=64
payload_limit_mib=48

# H200 SXM dense peaks and memory bandwidth, from NVIDIA's datasheet: the yardsticks of the
# summary table.
fp16_peak_tflops=989
hbm_peak_gbs=4800

# Time limits of the run, in seconds. Each step gets its own limit or what is left of the
# whole run's, whichever is less, so that even a run that had to build stays under 8 minutes.
run_budget=470
startup_timeout=20
test_timeout=200
bench_timeout=120
train_timeout=150
compare_timeout=100
torch_gemm_timeout=25
fallback_configure_timeout=90
fallback_build_timeout=300

# Each training or comparison run keeps this many seconds of its stage's limit for every run
# still to come after it, so that a slow first run cannot starve the others of their chance
# to start. The training stage has 16 runs: its first may take 150 - 15 * 5 = 75 seconds.
run_reserve=5

fashion_mnist_dir=/usr/share/datasets/fashion-mnist

# The time limit of the next step: its own, or what is left of the run's budget if less;
# 0 when too little is left to start it.
step_limit() {
  local left=$(( run_budget - SECONDS ))
  (( left < 10 )) && { echo 0; return; }
  echo $(( $1 < left ? $1 : left ))
}

usage() {
  cat >&2 <<'EOF'
usage: bash scripts/gpu_check.sh --prepare   (on the build machine: stage build-gpu/)
       bash scripts/gpu_check.sh OUTDIR      (on the GPU machine, with build-gpu/ carried)
EOF
  exit 2
}

log() { printf '== %s\n' "$*"; }

# ---------------------------------------------------------------------------------------------
# --prepare
# ---------------------------------------------------------------------------------------------

# Shared libraries of the staged binaries other than glibc's and the CUDA libraries (which
# come from the GPU machine), as resolved paths, one per line.
bundled_library_paths() {
  local binary
  for binary in "$@"; do
    ldd "${binary}"
  done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
    grep -Ev '^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libcuda\.so|libcublas|libcudnn|libnvrtc|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver|libnccl)' |
    awk '{ print $2 }' | sort -u
}

# The newest GLIBC_ symbol version the given ELF files need: they start only where the
# machine's glibc is at least that.
newest_glibc() {
  objdump -T "$@" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1
}

prepare() {
  local jobs="${MIXPREC_JOBS:-2}"
  # No MPI: the GPU machine has no MPI runtime, so binaries linked to libmpi would not start.
  log "configure ${tree} (CUDA on, sm_90, no -march=native, no MPI)"
  cmake -S "${root}" -B "${tree}" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXPREC_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DMIXPREC_NATIVE=OFF -DMIXPREC_BUILD_TESTS=ON \
    -DMIXPREC_BUILD_BENCH=ON -DMIXPREC_WITH_MPI=OFF ||
    { echo "prepare: configure failed" >&2; exit 2; }
  log "build ${binaries[*]} with -j${jobs}"
  cmake --build "${tree}" -j "${jobs}" --target "${binaries[@]}" ||
    { echo "prepare: build failed" >&2; exit 2; }

  rm -rf "${payload}" || { echo "prepare: cannot remove the old ${payload}" >&2; exit 2; }
  mkdir -p "${payload}/bin" "${payload}/lib"
  local name path
  for name in "${binaries[@]}"; do
    path="$(find "${tree}" -type f -name "${name}" -perm -u+x | head -n 1)"
    [[ -n "${path}" ]] || { echo "prepare: ${name} was not built" >&2; exit 2; }
    # Symbols are not needed to run; dropping them keeps the payload small.
    strip --strip-unneeded -o "${payload}/bin/${name}" "${path}"
  done

  local lib
  while IFS= read -r lib; do
    cp -L "${lib}" "${payload}/lib/"
  done < <(bundled_library_paths "${payload}"/bin/*)

  # The small data sets travel inside build-gpu/ (2.8 MiB): a shared/ folder beside the
  # checkout is not copied to the GPU machine.
  local data
  for data in tinyshakespeare mnist; do
    if [[ -d "${root}/../shared/data/${data}" ]]; then
      mkdir -p "${payload}/data"
      # Without the source's read-only modes, so that the next --prepare can replace it.
      cp -r --no-preserve=mode "${root}/../shared/data/${data}" "${payload}/data/" ||
        { echo "prepare: copying ${data} into build-gpu/data failed" >&2; exit 2; }
    fi
  done

  {
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) from $(git -C "${root}" rev-parse --short HEAD 2>/dev/null || echo 'an unknown commit')$(git -C "${root}" diff --quiet HEAD 2>/dev/null || echo ' with local changes')"
    echo "bin: ${binaries[*]}"
    echo "lib (used only when the machine lacks them): $(cd "${payload}/lib" && echo *)"
    echo "newest glibc needed by bin: $(newest_glibc "${payload}"/bin/*), by lib: $(newest_glibc "${payload}"/lib/*)"
  } > "${payload}/MANIFEST"
  cat "${payload}/MANIFEST"

  local size_kib size_mib
  size_kib="$(du -sk "${payload}" | cut -f1)"
  size_mib=$(( (size_kib + 1023) / 1024 ))
  du -sh "${payload}"/bin/* "${payload}"/lib
  log "build-gpu/ is ${size_mib} MiB (limit for carried paths: ${carry_limit_mib} MiB in all)"
  if (( size_mib > payload_limit_mib )); then
    echo "prepare: build-gpu/ is ${size_mib} MiB, above the ${payload_limit_mib} MiB this script allows" \
      "(carry limit ${carry_limit_mib} MiB); find what grew with 'du -sh build-gpu/*'" >&2
    exit 2
  fi
  log "ready: carry build-gpu and run 'bash scripts/gpu_check.sh OUTDIR' on the GPU machine"
}

# ---------------------------------------------------------------------------------------------
# The run on the GPU machine
# ---------------------------------------------------------------------------------------------

# Library folders of the CUDA libraries on this machine, one per line, best first: PyTorch's
# nvidia-* wheels (cuDNN, cuBLAS; cu13 wheels keep theirs under nvidia/cu13/lib), then the
# toolkit's lib64.
cuda_library_dirs() {
  if command -v python3 >/dev/null 2>&1; then
    timeout 30 python3 - <<'EOF' 2>/dev/null
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
seen = set()
for base in list(nvidia.__path__):
    for top, dirs, files in os.walk(base):
        if top[len(base):].count(os.sep) > 2:
            dirs[:] = []
            continue
        if os.path.basename(top) == "lib" and any(".so" in f for f in files):
            if top not in seen:
                seen.add(top)
                print(top)
EOF
  fi
  local nvcc_path
  nvcc_path="$(command -v nvcc || true)"
  local candidates=()
  [[ -n "${nvcc_path}" ]] && candidates+=("$(dirname "$(dirname "${nvcc_path}")")/lib64")
  candidates+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
  local dir
  for dir in "${candidates[@]}"; do
    [[ -d "${dir}" ]] && readlink -f "${dir}"
  done
  return 0
}

# Whether every binary in bin_dir starts (loads its libraries and runs a no-op). Judged by
# the output: Catch2 v2's --list-tags exits with the number of tags, not 0.
binaries_start() {
  local listed
  timeout "${startup_timeout}" "${bin_dir}/mixprec" --version || return 1
  listed="$(timeout "${startup_timeout}" "${bin_dir}/mixprec_cuda_tests" --list-tags 2>&1)"
  echo "${listed}"
  grep -q '\[cuda\]' <<<"${listed}" || return 1
  listed="$(timeout "${startup_timeout}" "${bin_dir}/mixprec_bench_kernels" \
    --benchmark_list_tests --benchmark_filter=Cuda 2>&1)"
  echo "${listed}"
  grep -q '^BM_CudaGemm' <<<"${listed}"
}

print_ldd() {
  local name
  for name in "${binaries[@]}"; do
    echo "-- ldd ${bin_dir}/${name}"
    ldd "${bin_dir}/${name}" 2>&1 || true
  done
}

# Building here from the sources: this machine has cmake, ninja and nvcc but probably none of
# the header and library packages mixprec builds against, which cannot be installed here.
fallback_build() {
  local missing=() header
  for header in eigen3/Eigen/Core spdlog/spdlog.h fmt/core.h yaml-cpp/yaml.h CLI/CLI.hpp \
    catch2/catch.hpp nlohmann/json.hpp benchmark/benchmark.h zlib.h; do
    if [[ ! -e "/usr/include/${header}" && ! -e "/usr/local/include/${header}" ]]; then
      missing+=("${header}")
    fi
  done
  local tool
  for tool in cmake ninja nvcc; do
    command -v "${tool}" >/dev/null 2>&1 || missing+=("${tool} (program)")
  done
  {
    echo "headers in /usr/include and /usr/local/include:"
    find /usr/include /usr/local/include -mindepth 1 -maxdepth 1 -printf '%f ' 2>&1
    echo
  } >>"${out}/env.log"
  if (( ${#missing[@]} > 0 )); then
    {
      echo "cannot build here either: missing ${missing[*]}"
      echo "(nothing can be installed on this machine; rebuild build-gpu/ on the build machine"
      echo " against libraries this machine has: see the ldd output above and env.log)"
    } | tee -a "${out}/env.log" >&2
    return 1
  fi
  local build_dir=/tmp/mixprec-build-gpu
  log "building from the sources in ${build_dir}"
  local build_limit
  build_limit="$(step_limit "${fallback_build_timeout}")"
  timeout "${fallback_configure_timeout}" cmake -S "${root}" -B "${build_dir}" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DMIXPREC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DMIXPREC_NATIVE=OFF >>"${out}/env.log" 2>&1 &&
    timeout "${build_limit}" cmake --build "${build_dir}" -j "$(nproc)" \
      --target "${binaries[@]}" >>"${out}/env.log" 2>&1
  local rc=$?
  if (( rc != 0 )); then
    echo "build here failed (exit ${rc}, 124 = timed out); last lines of env.log:" >&2
    tail -n 20 "${out}/env.log" >&2
    return 1
  fi
  mkdir -p "${build_dir}/staged"
  local name
  for name in "${binaries[@]}"; do
    cp "$(find "${build_dir}" -type f -name "${name}" -perm -u+x -not -path '*/staged/*' | head -n 1)" \
      "${build_dir}/staged/"
  done
  bin_dir="${build_dir}/staged"
}

# "passed failed" of a Catch2 v2 console log, from its last summary line.
catch_counts() {
  local summary
  summary="$(grep -E '^(All tests passed|test cases:)' "$1" | tail -n 1)"
  if [[ "${summary}" =~ ^All\ tests\ passed.*\ in\ ([0-9]+)\ test\ case ]]; then
    echo "${BASH_REMATCH[1]} 0"
  elif [[ "${summary}" =~ ([0-9]+)\ passed\ \|\ ([0-9]+)\ failed ]]; then
    echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
  elif [[ "${summary}" =~ ([0-9]+)\ failed ]]; then
    echo "0 ${BASH_REMATCH[1]}"
  else
    echo "? ?"
  fi
}

# The summary table, from the step results and bench.json / torch.log.
summary_table() {
  echo "mixprec GPU check: ${gpu_name}"
  printf '%-34s %s\n' "binaries" "${binaries_note}"
  printf '%-34s %s\n' "CUDA tests (${test_filter:-all})" "${tests_note}"
  if [[ -s "${out}/bench.json" ]] && command -v python3 >/dev/null 2>&1; then
    python3 "${report}" bench-table "${out}/bench.json" "${out}/train.json" \
      "${fp16_peak_tflops}" "${hbm_peak_gbs}"
  else
    printf '%-34s %s\n' "CUDA kernel benchmarks" "${bench_note}"
  fi
  torch_gemm_rows
  if [[ -s "${out}/train.json" ]] && command -v python3 >/dev/null 2>&1; then
    python3 "${report}" train-table "${out}/train.json"
  else
    printf '%-34s %s\n' "training (mixprec train)" "${train_note}"
  fi
  compare_rows
}

# The comparison's rows of the summary table, from compare.json: per config, mixprec's and
# PyTorch's median FP32 and FP16 steps, FP16's speed-up over FP32 in each (the issue's
# target: 2x for the CNN, 2.5x for the GPT) and mixprec's FP16 step over PyTorch's (target at
# most 0.75); compare_note when there is nothing to show. Then the issue's targets, one line
# each with its figure and whether it was met: these ratios, and the FP16 GEMM's share of the
# peak (the faster of the heuristic's and the tuned plan, from bench.json).
compare_rows() {
  if [[ ! -s "${out}/compare.json" ]] || ! command -v python3 >/dev/null 2>&1; then
    printf '%-34s %s\n' "mixprec against PyTorch eager" "${compare_note}"
    return
  fi
  python3 "${report}" compare-table "${out}/compare.json" "${out}/bench.json" \
    "${fp16_peak_tflops}"
}

# The torch.mm rows of the summary table, from the torch_gemm lines that torch_gemm.py wrote
# into torch.log; torch_gemm_note where a dtype has no figure.
torch_gemm_rows() {
  local dtype label value
  for dtype in fp16 bf16; do
    label="torch.mm 4096^3 ${dtype^^}"
    value="$(awk -v d="${dtype}" '$1 == "torch_gemm" && $2 == d && $3 == 4096 { v = $4 } END { print v }' \
      "${out}/torch.log" 2>/dev/null)"
    if [[ "${value}" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
      awk -v label="${label}" -v v="${value}" -v peak="${fp16_peak_tflops}" 'BEGIN {
        printf "%-34s %8.1f TFLOP/s  %5.1f%% of %.0f FP16 peak\n", label, v, 100 * v / peak, peak }'
    else
      printf '%-34s %s\n' "${label}" "${torch_gemm_note}"
    fi
  done
}

# The first data folder that holds `relative` (e.g. tinyshakespeare/input.txt), as the file's
# absolute path; fails when none does. See Data at the top.
find_data() {
  local relative="$1" dir
  for dir in "${MIXPREC_DATA_DIR:-}" "${payload}/data" "${root}/shared/data" \
    "${root}/../shared/data"; do
    if [[ -n "${dir}" && -f "${dir}/${relative}" ]]; then
      readlink -f "${dir}/${relative}"
      return 0
    fi
  done
  return 1
}

# The GPU configs as the training stage and the comparison with PyTorch run them, without
# their number of steps: gpt_base (configs/gpt_shakespeare_gpu.yaml on tiny shakespeare, 4
# evaluation batches) and cnn_base (configs/cnn_fashion.yaml, batches of 512, on Fashion-MNIST
# or else MNIST's test set, cnn_label saying which), each the config file then its --set
# options (on cuda:0, no evaluation or checkpoint before the end); empty without the data.
# Set once, before the stages that use them.
gpu_config_args() {
  local common=(--set device=cuda --set train.eval_every=0 --set checkpoint.every=0)
  local text images labels
  gpt_base=()
  if text="$(find_data tinyshakespeare/input.txt)"; then
    gpt_base=("${root}/configs/gpt_shakespeare_gpu.yaml" "${common[@]}" --set "data.path=${text}"
      --set data.eval_batches=4)
  fi
  cnn_label=cnn_fashion
  cnn_base=()
  local cnn_common=("${root}/configs/cnn_fashion.yaml" "${common[@]}" --set train.batch_size=512)
  if [[ -f "${fashion_mnist_dir}/train-images-idx3-ubyte.gz" &&
    -f "${fashion_mnist_dir}/t10k-images-idx3-ubyte.gz" ]]; then
    cnn_base=("${cnn_common[@]}")
  elif images="$(find_data mnist/t10k-images-idx3-ubyte.gz)" &&
    labels="$(find_data mnist/t10k-labels-idx1-ubyte.gz)"; then
    # No Fashion-MNIST here: MNIST's test set, as both splits, measures the same model.
    cnn_label="cnn_fashion on MNIST"
    cnn_base=("${cnn_common[@]}" --set "data.train_images=${images}"
      --set "data.train_labels=${labels}" --set "data.test_images=${images}"
      --set "data.test_labels=${labels}" --set data.normalize.mean=0.1307
      --set data.normalize.std=0.3081)
  fi
}

# PyTorch eager against mixprec on the same model, batch, data and GPU, within $1 seconds:
# scripts/bench_vs_torch.sh (torch_bench.py: autocast + GradScaler, TF32 off; then `mixprec
# bench --compare`) for the GPT (40 steps) and the CNN (60 steps), FP32 and FP16, medians
# after 5 warm-up steps, mixprec reading the device every 10 steps (train.log_every, the GPU
# GPT config's own); then `mixprec bench` of each again with train.cuda_graph, against the
# same PyTorch rows; the configs are gpu_config_args's. Their output goes to torch.log, the
# joined rows of each run to compare.json. Sets compare_failed when one failed or ran out of
# time.
compare_stage() {
  local limit="$1"
  local dir deadline=$(( SECONDS + limit ))
  dir="$(mktemp -d "${TMPDIR:-/tmp}/mixprec-compare.XXXXXX")"
  compare_failed=0
  : >"${dir}/runs.tsv"
  local key label steps runs_after=4 run_limit rc status torch_rows has_data args=()
  for key in gpt gpt_graph cnn cnn_graph; do
    runs_after=$(( runs_after - 1 ))
    case "${key}" in
      gpt*) label=gpt_shakespeare_gpu steps=40 args=(${gpt_base[@]+"${gpt_base[@]}"}) ;;
      cnn*) label="${cnn_label}" steps=60 args=(${cnn_base[@]+"${cnn_base[@]}"}) ;;
    esac
    has_data=$(( ${#args[@]} > 0 ))
    args+=(--precisions fp32,fp16 --steps "${steps}" --warmup 5 --set train.log_every=10)
    # The PyTorch rows this run is compared with: those bench_vs_torch.sh kept.
    torch_rows="${dir}/${key%_graph}/torch/compare.json"
    [[ -f "${torch_rows}" ]] || torch_rows="${dir}/${key%_graph}/torch/bench.json"
    [[ "${key}" == *_graph ]] && label="${label} cuda_graph"
    run_limit=$(( deadline - SECONDS - run_reserve * runs_after ))
    if (( ! has_data )); then
      status="not run: no data (set MIXPREC_DATA_DIR)"
    elif [[ "${key}" == *_graph && ! -f "${torch_rows}" ]]; then
      status="not run: no PyTorch rows to compare with"
    elif (( run_limit < 5 )); then
      status="not run: out of time"
    else
      log "${label}: mixprec against PyTorch (limit ${run_limit} s)"
      echo "== ${label}" >>"${out}/torch.log"
      if [[ "${key}" == *_graph ]]; then
        timeout "${run_limit}" "${bin_dir}/mixprec" bench "${args[@]}" \
          --set train.cuda_graph=true --compare "${torch_rows}" --out "${dir}/${key}/mixprec" \
          >>"${out}/torch.log" 2>&1
      else
        MIXPREC="${bin_dir}/mixprec" MIXPREC_PYTHON=python3 timeout "${run_limit}" \
          bash "${root}/scripts/bench_vs_torch.sh" "${args[@]}" --out "${dir}/${key}" \
          >>"${out}/torch.log" 2>&1
      fi
      rc=$?
      status=ok
      if (( rc == 124 )); then
        status="timed out after ${run_limit} s"
      elif (( rc != 0 )); then
        status="exit ${rc}"
      fi
    fi
    [[ "${status}" == ok ]] || compare_failed=1
    printf '%s\t%s\t%s\n' "${label}" "${status}" "${dir}/${key}/mixprec/bench.json" \
      >>"${dir}/runs.tsv"
  done
  python3 "${report}" gather-compare "${dir}/runs.tsv" "${out}/compare.json"
  compare_note="see compare.json"
}

# One line of ${train_dir}/runs.tsv: config label, precision, status ("ok", "exit N", "timed
# out after N s", "not run: ..."), run folder, console log, kernel profile (or nothing).
train_record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6:-}" >>"${train_dir}/runs.tsv"
}

# One run of the training stage: a config label, the precision, a folder name, the number of
# runs still to come after this one, then the `mixprec train` arguments. Its time limit is
# what is left of the stage's, less run_reserve for each run still to come.
train_one() {
  local label="$1" precision="$2" key="$3" runs_after="$4"
  shift 4
  local run_dir="${train_dir}/${key}-${precision}" run_log="${train_dir}/${key}-${precision}.log"
  local limit=$(( train_deadline - SECONDS - run_reserve * runs_after ))
  if (( limit < 5 )); then
    train_record "${label}" "${precision}" "not run: out of time" "" ""
    train_failed=1
    return
  fi
  log "mixprec train ${label} ${precision} (limit ${limit} s)"
  # A tuned run logs each problem's candidates with their times (cuda/autotune.h).
  MIXPREC_AUTOTUNE_LOG="${run_dir}.autotune.txt" \
    timeout "${limit}" "${bin_dir}/mixprec" train "$@" --set "precision=${precision}" \
    --out "${run_dir}" >"${run_log}" 2>&1
  local rc=$? status=ok
  if (( rc == 124 )); then
    status="timed out after ${limit} s"
  elif (( rc != 0 )); then
    status="exit ${rc}"
  fi
  [[ "${status}" == ok ]] || train_failed=1
  tail -n 2 "${run_log}"
  train_record "${label}" "${precision}" "${status}" "${run_dir}" "${run_log}" \
    "${MIXPREC_KERNEL_PROFILE:-}"
}

# A short FP16 run of one config with every kernel launch timed (cuda/kernel_profile.h): a
# config label, a folder name, the number of runs still to come, then the `mixprec train`
# arguments. Its step times are not comparable (reading the events back waits for the
# device); the table of device time per kernel is what it is for.
train_profiled() {
  local label="$1" key="$2" runs_after="$3"
  shift 3
  MIXPREC_KERNEL_PROFILE="${train_dir}/${key}-kernels.txt" \
    train_one "${label} (kernels timed)" fp16 "${key}_profiled" "${runs_after}" "$@"
}

# The training stage, within $1 seconds: `mixprec train` of configs/gpt_shakespeare_gpu.yaml
# (100 steps, 4 evaluation batches) and of configs/cnn_fashion.yaml (200 steps of 512), each
# in FP32 and then FP16 on cuda:0, with no evaluation or checkpoint before the end, then the
# per_step FP16 runs, the FP16 runs with train.cuda_graph, the autotuned FP32 and
# FP16 runs, the CNN's FP32 and FP16 runs tuned with non-deterministic convolutions admitted,
# and the kernel-timed FP16 runs; the configs are gpu_config_args's. The runs' summary.json,
# the end of their output and the kernel tables are gathered into train.json. Sets
# train_failed when a run failed or ran out of time.
training_stage() {
  local limit="$1"
  train_dir="$(mktemp -d "${TMPDIR:-/tmp}/mixprec-train.XXXXXX")"
  train_deadline=$(( SECONDS + limit ))
  train_failed=0
  : >"${train_dir}/runs.tsv"
  local gpt_args=() cnn_args=()
  (( ${#gpt_base[@]} > 0 )) && gpt_args=("${gpt_base[@]}" --set train.steps=100)
  (( ${#cnn_base[@]} > 0 )) && cnn_args=("${cnn_base[@]}" --set train.steps=200)

  # Each config in FP32 and FP16 (train.host_reads auto: read at log steps only), then FP16
  # reading the outcome after every step, which shows what the deferred step saves.
  local planned=0 precision
  local per_step=(--set train.host_reads=per_step)
  (( ${#gpt_args[@]} > 0 )) && planned=$(( planned + 7 ))
  (( ${#cnn_args[@]} > 0 )) && planned=$(( planned + 9 ))
  for precision in fp32 fp16 per_step; do
    if (( ${#gpt_args[@]} > 0 )); then
      planned=$(( planned - 1 ))
      if [[ "${precision}" == per_step ]]; then
        train_one "gpt_shakespeare_gpu per_step" fp16 gpt_per_step "${planned}" "${gpt_args[@]}" \
          "${per_step[@]}"
      else
        train_one gpt_shakespeare_gpu "${precision}" gpt "${planned}" "${gpt_args[@]}"
      fi
    else
      train_record gpt_shakespeare_gpu "${precision}" \
        "not run: no tinyshakespeare/input.txt (set MIXPREC_DATA_DIR)" "" ""
    fi
  done
  for precision in fp32 fp16 per_step; do
    if (( ${#cnn_args[@]} > 0 )); then
      planned=$(( planned - 1 ))
      if [[ "${precision}" == per_step ]]; then
        train_one "${cnn_label} per_step" fp16 cnn_per_step "${planned}" "${cnn_args[@]}" \
          "${per_step[@]}"
      else
        train_one "${cnn_label}" "${precision}" cnn "${planned}" "${cnn_args[@]}"
      fi
    else
      train_record "${cnn_label}" "${precision}" \
        "not run: no Fashion-MNIST (${fashion_mnist_dir}) nor MNIST (set MIXPREC_DATA_DIR)" "" ""
    fi
  done
  # FP16 with train.cuda_graph: the step recorded once per log window and replayed, against
  # the FP16 run above.
  local graph=(--set train.cuda_graph=true)
  if (( ${#gpt_args[@]} > 0 )); then
    planned=$(( planned - 1 ))
    train_one "gpt_shakespeare_gpu cuda_graph" fp16 gpt_graph "${planned}" "${gpt_args[@]}" \
      "${graph[@]}"
  fi
  if (( ${#cnn_args[@]} > 0 )); then
    planned=$(( planned - 1 ))
    train_one "${cnn_label} cuda_graph" fp16 cnn_graph "${planned}" "${cnn_args[@]}" "${graph[@]}"
  fi
  # FP32 and FP16 again with each new problem's algorithms timed on first use
  # (cuda/gemm_autotune.h, cuda/conv_autotune.h): what the libraries' heuristics leave.
  for precision in fp32 fp16; do
    if (( ${#gpt_args[@]} > 0 )); then
      planned=$(( planned - 1 ))
      MIXPREC_GEMM_AUTOTUNE=1 train_one "gpt_shakespeare_gpu autotuned" "${precision}" gpt_tuned \
        "${planned}" "${gpt_args[@]}"
    fi
  done
  for precision in fp32 fp16; do
    if (( ${#cnn_args[@]} > 0 )); then
      planned=$(( planned - 1 ))
      MIXPREC_GEMM_AUTOTUNE=1 MIXPREC_CONV_AUTOTUNE=1 train_one "${cnn_label} autotuned" \
        "${precision}" cnn_tuned "${planned}" "${cnn_args[@]}"
    fi
  done
  # The CNN tuned once more among all of cuDNN's algorithms, those that sum with atomics
  # included (cuda/conv_autotune.h; PyTorch's default): what determinism costs.
  for precision in fp32 fp16; do
    if (( ${#cnn_args[@]} > 0 )); then
      planned=$(( planned - 1 ))
      MIXPREC_GEMM_AUTOTUNE=1 MIXPREC_CONV_AUTOTUNE=1 MIXPREC_CONV_NONDETERMINISTIC=1 \
        train_one "${cnn_label} tuned nondet" "${precision}" cnn_nondet "${planned}" \
        "${cnn_args[@]}"
    fi
  done
  # Last, where the FP16 step's device time goes: short runs with every launch timed.
  if (( ${#gpt_args[@]} > 0 )); then
    planned=$(( planned - 1 ))
    train_profiled gpt_shakespeare_gpu gpt "${planned}" "${gpt_args[@]}" --set train.steps=30 \
      --set data.eval_batches=1
  fi
  if (( ${#cnn_args[@]} > 0 )); then
    planned=$(( planned - 1 ))
    train_profiled "${cnn_label}" cnn "${planned}" "${cnn_args[@]}" --set train.steps=60
  fi

  if ! command -v python3 >/dev/null 2>&1; then
    train_note="ran, but without python3 no table: see ${train_dir}"
    return
  fi
  python3 "${report}" gather-train "${train_dir}/runs.tsv" "${out}/train.json"
  train_note="see train.json"
}


run_on_gpu() {
  out="$1"
  mkdir -p "${out}" || { echo "cannot create ${out}" >&2; exit 2; }
  out="$(cd "${out}" && pwd)"
  local env_log="${out}/env.log"
  : > "${env_log}"
  : > "${out}/torch.log"
  bin_dir="${payload}/bin"
  gpu_name="no GPU"
  binaries_note="not checked"
  tests_note="not run"
  bench_note="not run"
  compare_note="not run"
  torch_gemm_note="not run"
  train_note="not run"
  test_filter="${MIXPREC_GPU_TEST_FILTER:-}"
  local status=0

  log "nvidia-smi -L"
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi -L 2>&1 | tee -a "${env_log}"
    gpu_name="$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total \
      --format=csv,noheader 2>/dev/null | head -n 1)"
    [[ -n "${gpu_name}" ]] || gpu_name="nvidia-smi lists no GPU"
    timeout 20 nvidia-smi >>"${env_log}" 2>&1
  else
    echo "nvidia-smi: not found (no NVIDIA driver on this machine)" | tee -a "${env_log}"
  fi

  if [[ ! -x "${bin_dir}/mixprec" ]]; then
    echo "no binaries in ${bin_dir}: run 'bash scripts/gpu_check.sh --prepare' on the build" \
      "machine and carry build-gpu/ (run this from the repository root)" | tee -a "${env_log}" >&2
    exit 3
  fi
  [[ -f "${payload}/MANIFEST" ]] && cat "${payload}/MANIFEST" >>"${env_log}"

  # CUDA libraries of this machine first: the binaries were linked against the build
  # machine's cuBLAS/cuDNN, whose sonames these provide.
  local dirs
  dirs="$(cuda_library_dirs | awk '!seen[$0]++' | paste -sd: -)"
  export LD_LIBRARY_PATH="${dirs}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH}" | tee -a "${env_log}"

  # The end-to-end CUDA tests were compiled in another checkout: this tells them where the
  # configs are (and, below them or beside them, shared/data).
  export MIXPREC_SOURCE_DIR="${root}"
  if [[ -z "${MIXPREC_DATA_DIR:-}" && -d "${payload}/data" ]]; then
    export MIXPREC_DATA_DIR="${payload}/data"
  fi
  {
    echo "MIXPREC_SOURCE_DIR=${MIXPREC_SOURCE_DIR}"
    echo "tiny shakespeare: $(find_data tinyshakespeare/input.txt || echo 'not found')"
    echo "MNIST test set: $(find_data mnist/t10k-images-idx3-ubyte.gz || echo 'not found')"
    if [[ -f "${fashion_mnist_dir}/train-images-idx3-ubyte.gz" ]]; then
      echo "Fashion-MNIST: ${fashion_mnist_dir}"
    else
      echo "Fashion-MNIST: not found (MNIST's test set stands in)"
    fi
  } | tee -a "${env_log}"

  # The configs as the comparison and the training stage run them.
  gpu_config_args

  log "ldd"
  print_ldd | tee -a "${env_log}"

  log "do the binaries start?"
  if binaries_start >>"${env_log}" 2>&1; then
    binaries_note="carried build-gpu/ (this machine's libraries)"
  else
    # Then with the host libraries carried from the build machine.
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH}:${payload}/lib"
    echo "retrying with ${payload}/lib on LD_LIBRARY_PATH" | tee -a "${env_log}"
    print_ldd >>"${env_log}"
    if binaries_start >>"${env_log}" 2>&1; then
      binaries_note="carried build-gpu/ (+ carried host libraries)"
    else
      tail -n 5 "${env_log}" >&2
      echo "the carried binaries do not start here (see env.log); trying to build here" |
        tee -a "${env_log}" >&2
      if fallback_build && binaries_start >>"${env_log}" 2>&1; then
        binaries_note="built on this machine (env.log)"
      else
        binaries_note="do not start, and cannot be built here"
        summary_table | tee "${out}/summary.txt"
        exit 3
      fi
    fi
  fi
  echo "binaries: ${binaries_note}" | tee -a "${env_log}"

  log "mixprec device"
  local device_text
  device_text="$(timeout "${startup_timeout}" "${bin_dir}/mixprec" device 2>&1)"
  echo "${device_text}" | tee -a "${env_log}"
  if ! grep -q "CUDA backend: registered" <<<"${device_text}"; then
    echo "no usable CUDA device: nothing to test or measure here (${device_text//$'\n'/; })" |
      tee -a "${env_log}" >&2
    tests_note="not run: no usable CUDA device"
    summary_table > "${out}/summary.txt"
    exit 4
  fi

  local start rc passed failed limit
  limit="$(step_limit "${test_timeout}")"
  if (( limit == 0 )); then
    tests_note="not run: out of time"
    status=1
  else
    log "CUDA tests (limit ${limit} s)"
    start=${SECONDS}
    local test_args=()
    [[ -n "${test_filter}" ]] && test_args+=("${test_filter}")
    timeout "${limit}" "${bin_dir}/mixprec_cuda_tests" "${test_args[@]}" --durations yes \
      >"${out}/tests.log" 2>&1
    rc=$?
    read -r passed failed < <(catch_counts "${out}/tests.log")
    tests_note="${passed} passed, ${failed} failed in $((SECONDS - start)) s"
    if (( rc == 124 )); then
      tests_note="timed out after ${limit} s (tests.log)"
      status=1
    elif (( rc != 0 )); then
      tests_note="${tests_note}, exit ${rc} (tests.log)"
      status=1
    fi
    grep -E '^(All tests passed|test cases:|assertions:)' "${out}/tests.log" | tail -n 2
  fi

  limit="$(step_limit "${bench_timeout}")"
  if (( limit == 0 )); then
    bench_note="not run: out of time"
    status=1
  else
    log "CUDA kernel benchmarks (limit ${limit} s)"
    start=${SECONDS}
    # BM_ImageBatch reads Fashion-MNIST, or MNIST's test set where that is missing.
    local bench_images="" bench_labels=""
    if [[ ! -f "${fashion_mnist_dir}/train-images-idx3-ubyte.gz" ]]; then
      bench_images="$(find_data mnist/t10k-images-idx3-ubyte.gz)" || bench_images=""
      bench_labels="$(find_data mnist/t10k-labels-idx1-ubyte.gz)" || bench_labels=""
    fi
    MIXPREC_BENCH_IMAGES="${bench_images}" MIXPREC_BENCH_LABELS="${bench_labels}" \
    timeout "${limit}" "${bin_dir}/mixprec_bench_kernels" \
      --benchmark_filter='^BM_(Cuda|ImageBatch)' --benchmark_min_time=0.2 --benchmark_out="${out}/bench.json" --benchmark_out_format=json \
      >"${out}/bench.log" 2>&1
    rc=$?
    bench_note="ran in $((SECONDS - start)) s (bench.log)"
    if (( rc != 0 )); then
      bench_note="exit ${rc}$( (( rc == 124 )) && echo ' (timed out)') (bench.log)"
      status=1
    fi
    grep -E '^BM_(Cuda|ImageBatch)' "${out}/bench.log" || true
  fi

  # torch.mm at the GEMM benchmark's shape, first in torch.log, before the comparison of
  # whole steps.
  limit="$(step_limit "${torch_gemm_timeout}")"
  if [[ "${MIXPREC_GPU_SKIP_TORCH:-0}" == 1 ]]; then
    torch_gemm_note="skipped (MIXPREC_GPU_SKIP_TORCH=1)"
  elif (( limit == 0 )); then
    torch_gemm_note="not run: out of time"
  else
    log "PyTorch torch.mm 4096^3 (limit ${limit} s)"
    echo "== torch_gemm.py" >>"${out}/torch.log"
    timeout "${limit}" python3 "${root}/scripts/torch_gemm.py" --n 4096 \
      >>"${out}/torch.log" 2>&1
    rc=$?
    torch_gemm_note="no figure (torch.log)"
    if (( rc != 0 )); then
      torch_gemm_note="exit ${rc}$( (( rc == 124 )) && echo ' (timed out)') (torch.log)"
    elif grep -q '^skipped:' "${out}/torch.log"; then
      torch_gemm_note="$(grep '^skipped:' "${out}/torch.log" | tail -n 1)"
    fi
    grep -E '^(torch_gemm|skipped:)' "${out}/torch.log" || true
  fi

  # The issue's step-time targets, side by side in one run: FP16 against FP32, and mixprec
  # against PyTorch eager on the same model.
  limit="$(step_limit "${compare_timeout}")"
  if [[ "${MIXPREC_GPU_SKIP_TORCH:-0}" == 1 ]]; then
    compare_note="skipped (MIXPREC_GPU_SKIP_TORCH=1)"
  elif (( limit == 0 )); then
    compare_note="not run: out of time"
    status=1
  else
    log "mixprec against PyTorch eager (limit ${limit} s)"
    compare_stage "${limit}"
    (( compare_failed == 0 )) || status=1
  fi

  limit="$(step_limit "${train_timeout}")"
  if [[ "${MIXPREC_GPU_SKIP_TRAIN:-0}" == 1 ]]; then
    train_note="skipped (MIXPREC_GPU_SKIP_TRAIN=1)"
  elif (( limit == 0 )); then
    train_note="not run: out of time"
    status=1
  else
    log "training stage (limit ${limit} s)"
    training_stage "${limit}"
    (( train_failed == 0 )) || status=1
  fi

  log "summary"
  summary_table | tee "${out}/summary.txt"
  exit "${status}"
}

case "${1:-}" in
  --prepare) [[ $# -eq 1 ]] || usage; prepare ;;
  -h | --help | "") usage ;;
  -*) usage ;;
  *) [[ $# -eq 1 ]] || usage; run_on_gpu "$1" ;;
esac
