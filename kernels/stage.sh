#!/usr/bin/env bash
# Build the chorus-cuda GPU test and benchmark binaries HERE (the development machine) and
# put them in target/device/, for a device machine that has no Rust toolchain and no network.
#
#   bash kernels/stage.sh
#   then, with the device tool: run(command="bash kernels/check.sh", carry=["target/device"],
#   timeout_s=400)
#
# Staged: the crate's unit tests (test-chorus_cuda: settle, abort records and guards on the
# GPU), the GPU tests (test-gpu: the engine's collectives on device memory), the staged
# link's (test-staged), chorus's device communicator's (test-cuda) and gpu_bench.
#
# The binaries need glibc >= this machine's (Debian 12: 2.36); the device image is newer.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=target/device
rm -rf "$dest"
mkdir -p "$dest"
say() { printf 'stage: %s\n' "$*"; }

say "building tests and the benchmark (release)"
# The JSON goes to a file and cargo's diagnostics to the terminal: a compile error must end
# staging with its message, not with an empty list of binaries.
json=$(mktemp)
trap 'rm -f "$json"' EXIT
if ! timeout 1800 cargo test -p chorus-cuda --release --no-run --message-format=json-render-diagnostics >"$json"; then
  say "building the tests failed (cargo's errors above)"
  exit 1
fi
# Device memory through chorus::Comm (the `cuda` feature): its staged-link and Comm tests.
if ! timeout 1800 cargo test -p chorus --features cuda --release --no-run --test cuda --message-format=json-render-diagnostics >>"$json"; then
  say "building chorus's device tests failed (cargo's errors above)"
  exit 1
fi
if ! timeout 1800 cargo build -p chorus-cuda --release --example gpu_bench; then
  say "building gpu_bench failed (cargo's errors above)"
  exit 1
fi
for t in chorus_cuda gpu staged cuda; do
  exe=$(grep '"executable":"' "$json" | grep "\"name\":\"$t\"" |
        sed 's/.*"executable":"\([^"]*\)".*/\1/' | tail -1)
  if [[ -z "$exe" || ! -x "$exe" ]]; then
    say "cannot find the test binary for $t"; exit 1
  fi
  cp "$exe" "$dest/test-$t"
done
cp target/release/examples/gpu_bench "$dest/gpu_bench"
strip "$dest"/* 2>/dev/null || true
# What was staged, for the check's log.
{
  git rev-parse --short HEAD 2>/dev/null || echo "no git"
  if git status --porcelain 2>/dev/null | grep -q .; then echo "(with uncommitted changes)"; fi
} | tr '\n' ' ' >"$dest/STAGED"
say "staged: $(cd "$dest" && ls | tr '\n' ' ')($(du -sh "$dest" | cut -f1))"
