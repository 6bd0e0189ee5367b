#!/usr/bin/env bash
# The peer comparison: chorus vs Gloo vs Open MPI all-reduce, side by side, in one run.
#
#   benches/peer/run.sh [--quick] [peer-run options…]      (peer-run --help lists them)
#
# 1. installs what is missing: Open MPI from Debian's packages (openmpi-bin libopenmpi-dev),
#    torch for Gloo from PyPI into a cached venv (see requirements-gloo.txt), the chorus
#    Python package (pip install ./python) into the same venv, a font for the plot;
# 2. builds peer-run, the limit programs and target/release/chorus, and compiles
#    mpi_allreduce.c with mpicc;
# 3. runs peer-run: the machine's limits and every system's sweep at 2 and 4 ranks, in
#    interleaved rounds, each under a deadline; writes bench-out/peer/report.md,
#    report.json, busbw.png (raw results and logs in bench-out/peer/raw/);
# 4. as root with ip(8): chorus (tcp) against Open MPI across two network namespaces joined
#    by a veth pair (netns.sh), into bench-out/peer/netns.md.
#
# A peer that cannot be installed or built is reported as not measured, with the reason;
# the others still run. Environment: CHORUS_BENCH_OUT (default bench-out/peer),
# CHORUS_BENCH_CACHE (default ~/.cache/chorus-bench), CHORUS_BENCH_NO_INSTALL=1 to install
# nothing (use what is there), CHORUS_BENCH_DDP=1 to also time one DDP training step,
# chorus against gloo at 2 and 4 ranks (ddp_step.py; $OUT/ddp_step.json and .txt),
# CHORUS_BENCH_NETNS=0 to skip the two-namespaces comparison (netns.sh; $OUT/netns.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${CHORUS_BENCH_OUT:-bench-out/peer}
CACHE=${CHORUS_BENCH_CACHE:-${HOME:-/tmp}/.cache/chorus-bench}
LOG="$OUT/install.log"
REQ=benches/peer/requirements-gloo.txt
mkdir -p "$OUT" "$CACHE"
: >"$LOG"

say() { echo "run.sh: $*" >&2; }
quick=0
for arg in "$@"; do [[ $arg == --quick ]] && quick=1; done

SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo -n); fi
apt_updated=0
apt_install() {
  if [[ ${CHORUS_BENCH_NO_INSTALL:-0} == 1 ]]; then return 1; fi
  if [[ $apt_updated == 0 ]]; then
    timeout 600 "${SUDO[@]}" apt-get update -q >>"$LOG" 2>&1 || return 1
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 1200 "${SUDO[@]}" \
    apt-get install -y -q --no-install-recommends "$@" >>"$LOG" 2>&1
}

started=$(date +%s)

# --- 1. Open MPI -------------------------------------------------------------------------
mpi_missing=""
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  say "installing Open MPI from Debian's packages (openmpi-bin libopenmpi-dev)…"
  if ! apt_install openmpi-bin libopenmpi-dev; then
    mpi_missing="Open MPI could not be installed (apt-get install openmpi-bin libopenmpi-dev failed; see $LOG)"
    say "$mpi_missing"
  fi
fi

# A font for the plot's text (the machines this runs on normally have one already).
if ! fc-list 2>/dev/null | grep -q .; then
  say "installing a font for the plot (fonts-dejavu-core fontconfig)…"
  apt_install fonts-dejavu-core fontconfig || say "no font: the plot may fail (see $LOG)"
fi

# --- 2. torch for Gloo, in a venv keyed by the requirements file ---------------------------
python_missing=""
key=$(sha256sum "$REQ" | cut -c1-12)
VENV="$CACHE/venv-$key"
if [[ ! -f $VENV/.complete ]]; then
  if [[ ${CHORUS_BENCH_NO_INSTALL:-0} == 1 ]]; then
    python_missing="torch is not installed and CHORUS_BENCH_NO_INSTALL=1"
  else
    say "installing torch (CUDA-built wheel, used on CPU only) into $VENV — about 2.3 GB, once…"
    rm -rf "$VENV"
    if ! { timeout 300 python3 -m venv "$VENV" >>"$LOG" 2>&1 ||
      { apt_install python3-venv && timeout 300 python3 -m venv "$VENV" >>"$LOG" 2>&1; }; }; then
      python_missing="cannot create a Python venv (python3 -m venv failed; see $LOG)"
    elif ! timeout 1800 "$VENV/bin/pip" install -q --no-deps --only-binary=:all: -r "$REQ" >>"$LOG" 2>&1; then
      python_missing="pip install of torch failed (see $LOG)"
    else
      touch "$VENV/.complete"
    fi
  fi
  [[ -n $python_missing ]] && say "$python_missing"
fi
# --- 2b. the chorus package into the same venv, for the chorus (python) column -----------
# Built from this checkout with maturin (pip install ./python); numpy for its arrays.
if [[ -z $python_missing && ${CHORUS_BENCH_NO_INSTALL:-0} != 1 ]]; then
  say "installing the chorus package into $VENV (pip install ./python, numpy)…"
  if ! { timeout 600 "$VENV/bin/pip" install -q numpy==2.4.6 >>"$LOG" 2>&1 &&
    CARGO_TARGET_DIR="$ROOT/target" timeout 1800 \
      "$VENV/bin/pip" install -q --force-reinstall --no-deps ./python >>"$LOG" 2>&1; }; then
    say "the chorus package could not be installed: chorus (python) will not be measured (see $LOG)"
  fi
fi
installed=$(date +%s)

# --- 3. build ----------------------------------------------------------------------------
say "building peer-run and chorus (cargo build --release)…"
if ! timeout 3600 cargo build --release -q -p chorus-benches -p chorus-cli 2>>"$LOG"; then
  say "cargo build failed (see $LOG)"
  exit 1
fi
MPI_PROGRAM="$OUT/mpi_allreduce"
if [[ -z $mpi_missing ]]; then
  rm -f "$MPI_PROGRAM"
  if ! timeout 120 mpicc -O2 -o "$MPI_PROGRAM" benches/peer/mpi_allreduce.c >>"$LOG" 2>&1; then
    mpi_missing="mpicc could not compile benches/peer/mpi_allreduce.c (see $LOG)"
    say "$mpi_missing"
  fi
fi
built=$(date +%s)
say "install took $((installed - started)) s, build $((built - installed)) s"

# --- 4. run ------------------------------------------------------------------------------
args=(--out "$OUT" --version-note "chorus=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)")
if [[ -n $python_missing ]]; then args+=(--python-missing "$python_missing"); else args+=(--python "$VENV/bin/python"); fi
if [[ -n $mpi_missing ]]; then args+=(--mpi-missing "$mpi_missing"); else args+=(--mpi-program "$MPI_PROGRAM"); fi

# peer-run bounds every sweep and its own run; this outer limit is the last resort, and
# peer-run answers its SIGTERM by killing the running sweep and writing its report.
limit=$((quick == 1 ? 1200 : 3600))
set +e
timeout --kill-after=60 "$limit" target/release/peer-run "${args[@]}" "$@"
status=$?
set -e
say "run took $(($(date +%s) - built)) s; report in $OUT/report.md, $OUT/report.json, $OUT/busbw.png"

# --- 5. optional: one DDP training step, chorus against gloo ------------------------------
if [[ ${CHORUS_BENCH_DDP:-0} == 1 ]]; then
  if [[ -n $python_missing ]]; then
    say "DDP step not measured: $python_missing"
  else
    say "timing one DDP step, chorus against gloo, 2 and 4 ranks (ddp_step.py)…"
    rounds=$((quick == 1 ? 3 : 7))
    if (cd benches/peer && timeout --kill-after=30 1500 "$VENV/bin/python" ddp_step.py -n 2 4 -r "$rounds") \
      >"$OUT/ddp_step.json" 2>"$OUT/ddp_step.txt"; then
      cat "$OUT/ddp_step.txt" >&2
    else
      say "the DDP step run failed (see $OUT/ddp_step.txt)"
    fi
  fi
fi
# --- 6. across two network-namespace hosts (root and ip(8) only) --------------------------
# chorus over TCP in its multi-node mode against Open MPI's TCP BTL, the ranks split over
# two namespaces joined by a veth pair (netns.sh). CHORUS_BENCH_NETNS=0 skips it.
if [[ ${CHORUS_BENCH_NETNS:-1} != 0 ]]; then
  mpi_arg=-
  [[ -z $mpi_missing ]] && mpi_arg=$MPI_PROGRAM
  quick_arg=()
  ((quick)) && quick_arg=(--quick)
  say "across two network namespaces, chorus (tcp) against Open MPI (netns.sh)…"
  if ! timeout --kill-after=30 1800 benches/peer/netns.sh "$OUT" target/release/chorus "$mpi_arg" "${quick_arg[@]}"; then
    say "the namespace run failed (see $OUT/netns/)"
  fi
fi
exit "$status"
