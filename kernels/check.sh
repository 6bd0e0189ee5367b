#!/usr/bin/env bash
# The chorus-cuda device check: on a machine with an NVIDIA GPU, build (or take the staged
# binaries from kernels/stage.sh), run the GPU tests, then benchmark — reduce kernels beside
# a device-to-device copy, all-reduce bus bandwidth at 2 and 4 ranks on one GPU from 1 MiB
# to 1 GiB, NCCL on the same sizes where it allows several ranks per GPU, and the latency
# of aborting a kernel blocked on an absent peer. About 5 minutes in all.
#
#   bash kernels/check.sh            (results and logs go to $OUT, else target/device-check)
#
# Every step has a time limit; a failed step is reported and the check goes on to the
# summary, and the exit status is non-zero if any step failed.
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
    [[ $rc -eq 124 || $rc -eq 137 ]] && say "== $name: TIMED OUT after ${limit}s" || say "== $name: FAILED (exit $rc)"
    failed+=("$name")
  fi
  return $rc
}

say "chorus-cuda device check, $(date -u +%FT%TZ)"
step "gpu" 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

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
export CHORUS_KERNEL_CACHE="$out/kernel-cache"

bin="$root/target/device"
if [[ -x "$bin/test-gpu" && -x "$bin/gpu_bench" ]]; then
  say "using the binaries staged by kernels/stage.sh in target/device"
elif command -v cargo >/dev/null 2>&1; then
  step "build" 300 bash kernels/stage.sh || say "the build failed; nothing to run"
else
  say "no cargo here and no staged binaries in target/device."
  say "This machine cannot fetch a toolchain: run 'bash kernels/stage.sh' on a machine with Rust"
  say "and carry target/device (the device tool's carry=[\"target/device\"])."
  exit 2
fi

[[ -x "$bin/test-chorus_cuda" ]] && step "unit tests" 60 "$bin/test-chorus_cuda" --test-threads=2
[[ -x "$bin/test-gpu" ]] && step "gpu tests" 150 "$bin/test-gpu" --test-threads=1 --nocapture
[[ -x "$bin/gpu_bench" ]] && step "chorus benchmark" 150 "$bin/gpu_bench" --out "$out/chorus_bench.jsonl" --budget-s 100
if command -v python3 >/dev/null 2>&1; then
  step "nccl benchmark" 120 env PYTHONUNBUFFERED=1 python3 kernels/nccl_bench.py --out "$out/nccl_bench.jsonl" --budget-s 80
else
  say "skipped NCCL comparison: no python3"
fi

say ""
say "== summary"
for f in "$out"/*.jsonl; do [[ -e "$f" ]] && say "$(basename "$f"): $(wc -l <"$f") results"; done
grep -h '"kind":"abort_retire"' "$out"/chorus_bench.jsonl 2>/dev/null | tee -a "$log"
grep -h 'abort retired' "$log" | head -1
if ((${#failed[@]})); then
  say "FAILED steps: ${failed[*]}"
  exit 1
fi
say "all steps passed"
