#!/usr/bin/env bash
# The chorus-cuda device check, for a machine with an NVIDIA GPU (an H200 when one is lent),
# in at most about 6 minutes. It takes the binaries staged by kernels/stage.sh (or builds
# them, where cargo exists) and runs:
#   1. the crate's unit tests on the GPU (settle, ledger, credit, pool, retired waits);
#   2. the GPU tests: the device's arithmetic, abort of an operation blocked on an absent
#      peer (seed 002: the abort lands, the caller's stream drains, the context is reused),
#      then every collective x dtype x reduction at 2 and 4 ranks as threads, and as
#      processes. These run with CUDA_DEVICE_MAX_CONNECTIONS as the machine has it (8 by
#      default: 4 ranks in one process make 28 streams, the case host-side credit is for);
#   3. the benchmark, with CUDA_DEVICE_MAX_CONNECTIONS=32 (each rank's links get queues of
#      their own): reduce-kernel bandwidth beside a device-to-device copy, same-GPU
#      all-reduce bus bandwidth at 2 and 4 ranks from 1 MiB to 1 GiB, abort-to-retire latency;
#   4. NCCL on the same sizes with NCCL_MULTI_RANK_GPU_ENABLE=1 (several ranks on one GPU),
#      and a side-by-side table.
#
#   here:            bash kernels/stage.sh
#   device machine:  run(command="bash kernels/check.sh", carry=["target/device"], timeout_s=420)
#   dry run:         bash kernels/check.sh --dry-run     (what would run, with what limits)
#
# Options: --dry-run; --bin DIR (staged binaries, default target/device); --only NAME[,NAME]
# (run only those steps: unit, gpu, matrix, processes, comm, bench, nccl).
# Results and logs go to $OUT (else target/device-check): check.log, chorus_bench.jsonl,
# nccl_bench.jsonl. Every step has a time limit; a failed step is reported and the check goes
# on to the summary; the exit status is 1 if any step failed, 2 if there was nothing to run.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

dry=0
bin="$root/target/device"
only=""
while (($#)); do
  case $1 in
    --dry-run) dry=1 ;;
    --bin) bin=${2:?--bin needs a directory}; shift ;;
    --only) only=${2:?--only needs step names}; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

out="${OUT:-$root/target/device-check}"
mkdir -p "$out"
log="$out/check.log"
: >"$log"
failed=()
ran=0

say() { printf '%s\n' "$*" | tee -a "$log"; }
wanted() { [[ -z $only || ",$only," == *",$1,"* ]]; }
# step NAME LIMIT_S CMD...: run CMD with a time limit, output to the log and the terminal; a
# failure is counted.
step() {
  local name=$1 limit=$2
  shift 2
  say ""
  say "== $name (limit ${limit}s)"
  if ((dry)); then
    say "   would run: $*"
    return 0
  fi
  ran=$((ran + 1))
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [[ $rc -eq 0 ]]; then
    say "== $name: ok ($((SECONDS - t0))s)"
  else
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      say "== $name: TIMED OUT after ${limit}s"
    else
      say "== $name: FAILED (exit $rc)"
    fi
    failed+=("$name")
  fi
  return $rc
}
# info NAME LIMIT_S CMD...: like step, for what only describes the machine: its failure is
# logged but does not fail the check (`step ... || true` would not do that: step has already
# counted the failure by the time it returns).
info() {
  local before=${#failed[@]}
  step "$@"
  failed=("${failed[@]:0:before}")
  return 0
}

say "chorus-cuda device check, $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')$( ((dry)) && echo ' (dry run)')"
info "gpu" 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# NVRTC is often outside the loader's path: a toolkit's lib64, or PyPI's nvidia-cuda-nvrtc
# wheel (CUDA 13: site-packages/nvidia/cu13/lib; CUDA 12: site-packages/nvidia/cuda_nvrtc/lib).
# chorus searches those itself ($CUDA_HOME, /usr/local/cuda*, $VIRTUAL_ENV...); elsewhere,
# find it and point CHORUS_NVRTC at it.
if [[ -z ${CHORUS_NVRTC:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.1[23]'; then
  nvrtc=""
  for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    compgen -G "$d/libnvrtc.so.1[23]" >/dev/null && nvrtc="$d" && break
  done
  if [[ -z "$nvrtc" ]]; then
    nvrtc=$(timeout 60 find / -xdev \( -path /proc -o -path /sys -o -name .debug \) -prune -o \
      -name 'libnvrtc.so.1[23]' -print 2>/dev/null | sort | head -1 | xargs -r dirname)
  fi
  if [[ -n "$nvrtc" ]]; then
    export CHORUS_NVRTC="$nvrtc"
    say "NVRTC: $nvrtc"
  else
    say "NVRTC: libnvrtc.so.13/.12 not found; the GPU steps will report the device unavailable"
  fi
fi
# Compiled kernels are cached across the steps' processes, outside $OUT (only results
# come back from there).
export CHORUS_KERNEL_CACHE="${TMPDIR:-/tmp}/chorus-kernel-cache"
# Here a GPU test that cannot open the GPU fails instead of skipping.
export CHORUS_REQUIRE_GPU=1

if [[ -x "$bin/test-gpu" && -x "$bin/gpu_bench" ]]; then
  say "using the binaries staged in $bin ($(cat "$bin/STAGED" 2>/dev/null || echo 'unknown commit'))"
elif ((dry)); then
  say "no staged binaries in $bin: a real run would build them with kernels/stage.sh"
elif command -v cargo >/dev/null 2>&1; then
  step "build" 600 bash kernels/stage.sh || say "the build failed; nothing to run"
else
  say "no cargo here and no staged binaries in $bin."
  say "This machine cannot fetch a toolchain: run 'bash kernels/stage.sh' on a machine with Rust"
  say "and carry target/device (the device tool's carry=[\"target/device\"])."
  exit 2
fi

have() { ((dry)) || [[ -x "$bin/$1" ]]; }
queues=${CUDA_DEVICE_MAX_CONNECTIONS:-8 (default)}
if wanted unit && have test-chorus_cuda; then
  step "unit tests on the GPU" 30 "$bin/test-chorus_cuda" --test-threads=2
fi
if have test-gpu; then
  if wanted gpu; then
    step "gpu tests: arithmetic, abort and the seed-002 case, two processes" 45 \
      "$bin/test-gpu" --test-threads=1 --nocapture \
      abort every_reduction ranks_in_two_processes the_inputs
  fi
  if wanted matrix; then
    say "(hardware queues: CUDA_DEVICE_MAX_CONNECTIONS=$queues)"
    step "gpu matrix, 2 and 4 ranks as threads" 70 \
      "$bin/test-gpu" --test-threads=1 --nocapture --exact \
      every_collective_dtype_and_reduction_at_2_ranks_on_one_gpu \
      every_collective_dtype_and_reduction_at_4_ranks_on_one_gpu
  fi
  if wanted processes; then
    step "gpu matrix, 2 and 4 ranks as processes" 80 \
      "$bin/test-gpu" --test-threads=1 --nocapture --exact \
      every_collective_dtype_and_reduction_at_2_and_4_ranks_in_processes
  fi
fi
if wanted comm && have test-staged && have test-cuda; then
  step "device memory through Comm: staged links at 2 and 4 ranks, abort and drain" 60 \
    env CHORUS_REQUIRE_GPU=1 bash -c '"$1" --test-threads=1 --nocapture && "$2" --test-threads=1 --nocapture' \
    _ "$bin/test-staged" "$bin/test-cuda"
fi
if wanted bench && have gpu_bench; then
  step "chorus benchmark (reduce vs copy, all-reduce 2 and 4 ranks 1 MiB..1 GiB, abort-retire)" 55 \
    env CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin/gpu_bench" --out "$out/chorus_bench.jsonl" --budget-s 45
fi
if wanted nccl; then
  if command -v python3 >/dev/null 2>&1; then
    step "nccl benchmark (NCCL_MULTI_RANK_GPU_ENABLE=1, same sizes)" 60 \
      env PYTHONUNBUFFERED=1 python3 kernels/nccl_bench.py --out "$out/nccl_bench.jsonl" --budget-s 30
  else
    say "skipped the NCCL comparison: no python3"
  fi
fi

say ""
say "== summary"
if ((dry)); then
  say "dry run: nothing ran"
  exit 0
fi
for f in "$out"/*.jsonl; do [[ -e "$f" ]] && say "$(basename "$f"): $(wc -l <"$f") results"; done
if command -v python3 >/dev/null 2>&1 && [[ -e "$out/chorus_bench.jsonl" ]]; then
  python3 kernels/bench_table.py "$out"/chorus_bench.jsonl "$out"/nccl_bench.jsonl 2>&1 | tee -a "$log"
fi
grep -h '"kind":"abort_retire"' "$out"/chorus_bench.jsonl 2>/dev/null | tee -a "$log"
grep -h 'abort retired' "$log" | head -1
if ((ran == 0)); then
  say "nothing ran (no staged binaries for the steps asked for)"
  exit 2
fi
if ((${#failed[@]})); then
  say "FAILED steps: ${failed[*]}"
  exit 1
fi
say "all steps passed"
