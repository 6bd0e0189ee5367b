#!/usr/bin/env bash
# The chorus-cuda device check: on a machine with an NVIDIA GPU, take the binaries staged by
# kernels/stage.sh (or build them, where cargo exists), run the GPU tests — every collective
# of the engine x dtype x reduction on device memory at 2 and 4 ranks sharing the GPU, two
# ranks in two processes, settle and abort — then benchmark: reduce kernels beside a
# device-to-device copy, all-reduce bus bandwidth through the engine at 2 and 4 ranks from
# 1 MiB to 1 GiB, NCCL on the same sizes where it allows several ranks per GPU, and the
# latency of aborting a kernel blocked on an absent peer. About 3 minutes, 5 at most.
#
#   here:            bash kernels/stage.sh
#   device machine:  run(command="bash kernels/check.sh", carry=["target/device"], timeout_s=400)
#
# Results and logs go to $OUT (else target/device-check): check.log, chorus_bench.jsonl,
# nccl_bench.jsonl. Every step has a time limit; a failed step is reported and the check
# goes on to the summary; the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out="${OUT:-$root/target/device-check}"
mkdir -p "$out"
log="$out/check.log"
: >"$log"
failed=()

say() { printf '%s\n' "$*" | tee -a "$log"; }
# step NAME LIMIT_S CMD...: run CMD with a time limit, output to the log and the terminal.
step() {
  local name=$1 limit=$2
  shift 2
  say ""
  say "== $name (limit ${limit}s)"
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

say "chorus-cuda device check, $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"
info "gpu" 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# NVRTC is often outside the loader's path (a toolkit's lib64, a Python wheel): find it.
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13'; then
  nvrtc=""
  for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e "$d/libnvrtc.so.13" ]] && nvrtc="$d" && break
  done
  if [[ -z "$nvrtc" ]]; then
    nvrtc=$(timeout 60 find / -xdev -name 'libnvrtc.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1 | xargs -r dirname)
  fi
  if [[ -n "$nvrtc" ]]; then
    export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "NVRTC: $nvrtc"
  else
    say "NVRTC: libnvrtc.so.13 not found; the GPU steps will report the device unavailable"
  fi
fi
# Compiled kernels are cached across the steps' processes, outside $OUT (only results
# come back from there).
export CHORUS_KERNEL_CACHE="${TMPDIR:-/tmp}/chorus-kernel-cache"
# Here a GPU test that cannot open the GPU fails instead of skipping.
export CHORUS_REQUIRE_GPU=1

bin="$root/target/device"
if [[ -x "$bin/test-gpu" && -x "$bin/gpu_bench" ]]; then
  say "using the binaries staged by kernels/stage.sh in target/device ($(cat "$bin/STAGED" 2>/dev/null || echo 'unknown commit'))"
elif command -v cargo >/dev/null 2>&1; then
  step "build" 600 bash kernels/stage.sh || say "the build failed; nothing to run"
else
  say "no cargo here and no staged binaries in target/device."
  say "This machine cannot fetch a toolchain: run 'bash kernels/stage.sh' on a machine with Rust"
  say "and carry target/device (the device tool's carry=[\"target/device\"])."
  exit 2
fi

# The crate's own tests first (they open the GPU and compile the kernels into the cache):
# settle is bounded and abortable, a payload an abort kept from arriving fails the settle,
# a retired send stops its puts and signals.
# Then the engine on the GPU: the quick tests, then the matrix (its own step, so a slow
# matrix cannot starve the others). The limits add up to 5 minutes; a run takes about 3.
if [[ -x "$bin/test-chorus_cuda" ]]; then
  step "unit tests" 40 "$bin/test-chorus_cuda" --test-threads=2
fi
if [[ -x "$bin/test-gpu" ]]; then
  step "gpu tests" 50 "$bin/test-gpu" --test-threads=1 --nocapture \
    abort every_reduction ranks_in_two_processes the_inputs
  step "gpu matrix" 80 "$bin/test-gpu" --test-threads=1 --nocapture every_collective
fi
if [[ -x "$bin/gpu_bench" ]]; then
  step "chorus benchmark" 60 "$bin/gpu_bench" --out "$out/chorus_bench.jsonl" --budget-s 45
fi
if command -v python3 >/dev/null 2>&1; then
  step "nccl benchmark" 60 env PYTHONUNBUFFERED=1 python3 kernels/nccl_bench.py --out "$out/nccl_bench.jsonl" --budget-s 30
else
  say "skipped NCCL comparison: no python3"
fi

say ""
say "== summary"
for f in "$out"/*.jsonl; do [[ -e "$f" ]] && say "$(basename "$f"): $(wc -l <"$f") results"; done
if command -v python3 >/dev/null 2>&1; then
  python3 kernels/bench_table.py "$out"/chorus_bench.jsonl "$out"/nccl_bench.jsonl 2>&1 | tee -a "$log"
fi
grep -h '"kind":"abort_retire"' "$out"/chorus_bench.jsonl 2>/dev/null | tee -a "$log"
grep -h 'abort retired' "$log" | head -1
if ((${#failed[@]})); then
  say "FAILED steps: ${failed[*]}"
  exit 1
fi
say "all steps passed"
