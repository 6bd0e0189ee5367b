#!/usr/bin/env bash
# The two-hosts comparison: chorus over TCP against Open MPI's TCP BTL, across two network
# namespaces joined by a veth pair (each namespace a "host" with its own stack, the ranks
# split evenly between them), in interleaved rounds. Needs root and `ip`; run.sh calls it
# after the loopback comparison (CHORUS_BENCH_NETNS=0 skips it).
#
#   benches/peer/netns.sh OUT CHORUS MPI_PROGRAM|- [--quick]
#
# chorus runs in its multi-node mode, one `chorus bench --nnodes 2 --node-rank I` per
# namespace (node 0 hosts the bootstrap root on its veth address and writes the token file
# node 1 reads). Open MPI's mpirun runs in the first namespace with both veth addresses as
# hosts; its launcher agent is a wrapper that enters the second namespace instead of
# ssh-ing (`ip netns exec`), and both its out-of-band channel and its TCP BTL are held to
# the veth. MPI_PROGRAM "-" (or a failed Open MPI run) reports chorus only, with the reason.
# Writes OUT/netns.md (medians over rounds, the ratios) and OUT/netns/ (raw documents,
# logs). The namespaces and the veth are removed however the script ends.
set -euo pipefail

OUT=${1:?usage: netns.sh OUT CHORUS MPI_PROGRAM [--quick]}
CHORUS=${2:?chorus binary}
MPI_PROGRAM=${3:?mpi program or -}
QUICK=0
[[ ${4:-} == --quick ]] && QUICK=1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RAW="$OUT/netns"
mkdir -p "$RAW"
say() { echo "netns.sh: $*" >&2; }

if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  say "not measured: needs root and ip(8)"
  printf '# Across two network namespaces\n\nNot measured: needs root and ip(8).\n' >"$OUT/netns.md"
  exit 0
fi

TAG=$$
A="chorusA$TAG"
B="chorusB$TAG"
ADDR_A=10.199.$((TAG % 200)).1
ADDR_B=10.199.$((TAG % 200)).2
VA="cva$TAG"
VB="cvb$TAG"
cleanup() {
  ip netns pids "$A" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$B" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  ip link del "$VA" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! { ip netns add "$A" && ip netns add "$B" &&
  ip link add "$VA" type veth peer name "$VB" &&
  ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" &&
  ip -n "$A" addr add "$ADDR_A/24" dev "$VA" && ip -n "$B" addr add "$ADDR_B/24" dev "$VB" &&
  ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
  ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up; } 2>"$RAW/setup.log"; then
  say "not measured: could not create the namespaces (see $RAW/setup.log)"
  printf '# Across two network namespaces\n\nNot measured: creating the namespaces failed: %s\n' \
    "$(tr '\n' ' ' <"$RAW/setup.log")" >"$OUT/netns.md"
  exit 0
fi
# The link is up once a ping crosses it (bounded).
for _ in $(seq 50); do
  ip netns exec "$A" ping -c1 -W1 "$ADDR_B" >/dev/null 2>&1 && break
  sleep 0.1
done

if ((QUICK)); then ROUNDS=3; ITERS=10; else ROUNDS=5; ITERS=20; fi
SIZES=(-b 8 -e 16M -f 4 -w 5 -i "$ITERS")
LIMIT=300

# One chorus run of `ranks` ranks, half in each namespace; its JSON document on stdout.
chorus_run() {
  local ranks=$1 tag=$2 per=$(($1 / 2)) port=$((29000 + RANDOM % 2000))
  local token="$RAW/token-$tag"
  rm -f "$token"
  ip netns exec "$B" timeout "$LIMIT" "$CHORUS" bench all-reduce -n "$per" "${SIZES[@]}" \
    --transport tcp --nnodes 2 --node-rank 1 --master "$ADDR_A:$port" --token-file "$token" \
    --json >"$RAW/$tag.node1.json" 2>"$RAW/$tag.node1.log" &
  local node1=$!
  local rc=0
  ip netns exec "$A" timeout "$LIMIT" "$CHORUS" bench all-reduce -n "$per" "${SIZES[@]}" \
    --transport tcp --nnodes 2 --node-rank 0 --master "$ADDR_A:$port" --token-file "$token" \
    --json >"$RAW/$tag.json" 2>"$RAW/$tag.log" || rc=$?
  wait "$node1" || { local r=$?; ((rc)) || rc=$r; }
  return "$rc"
}

# The launcher agent Open MPI calls instead of ssh: `agent HOST COMMAND…` runs COMMAND in
# the namespace that owns HOST's address.
AGENT="$RAW/agent"
cat >"$AGENT" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in
  $ADDR_A) ns=$A ;;
  $ADDR_B) ns=$B ;;
  *) echo "netns agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$AGENT"

mpi_run() {
  local ranks=$1 tag=$2 per=$(($1 / 2))
  # Every "host" shares this machine's cores: more ranks than cores is oversubscribed, where
  # Open MPI (as on loopback, told by --oversubscribe) yields its polling ranks' cores.
  local yield=0
  ((ranks > $(nproc))) && yield=1
  printf '%s slots=%s\n%s slots=%s\n' "$ADDR_A" "$per" "$ADDR_B" "$per" >"$RAW/hosts"
  ip netns exec "$A" timeout "$LIMIT" mpirun --allow-run-as-root -n "$ranks" \
    --hostfile "$RAW/hosts" --map-by slot --bind-to none \
    --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$ADDR_A/24" --mca btl_tcp_if_include "$ADDR_A/24" \
    --mca pml ob1 --mca btl tcp,self --mca mpi_yield_when_idle "$yield" \
    "$MPI_PROGRAM" "${SIZES[@]}" -t tcp >"$RAW/$tag.json" 2>"$RAW/$tag.log"
}

mpi_reason=""
if [[ $MPI_PROGRAM == - ]]; then
  mpi_reason="Open MPI is not installed or mpi_allreduce did not build"
fi

uptime_before=$(uptime)
for ranks in 2 4; do
  for round in $(seq "$ROUNDS"); do
    say "$ranks ranks, round $round/$ROUNDS"
    chorus_run "$ranks" "chorus-$ranks-$round" || say "chorus failed (see $RAW/chorus-$ranks-$round.log)"
    if [[ -z $mpi_reason ]] && ! mpi_run "$ranks" "mpi-$ranks-$round"; then
      mpi_reason="mpirun across the namespaces failed: $(tail -n 3 "$RAW/mpi-$ranks-$round.log" | tr '\n' ' ')"
      say "$mpi_reason"
    fi
  done
done
uptime_after=$(uptime)

python3 - "$RAW" "$ROUNDS" "$mpi_reason" "$uptime_before" "$uptime_after" >"$OUT/netns.md" <<'PY'
# Medians over rounds of each size's in-place and out-of-place time and bus bandwidth.
import json, statistics, sys
raw, rounds, mpi_reason, before, after = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]

def load(tag):
    try:
        with open(f"{raw}/{tag}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def medians(system, ranks):
    docs = [d for d in (load(f"{system}-{ranks}-{r}") for r in range(1, rounds + 1)) if d]
    table = {}
    for d in docs:
        for row in d.get("rows", []):
            for mode in ("out_of_place", "in_place"):
                m = row.get(mode) or {}
                if m.get("wrong", 0) != 0:
                    continue
                t = table.setdefault((row["size"], mode), ([], []))
                t[0].append(m["time_us"])
                t[1].append(m["busbw_gbs"])
    return len(docs), {k: (statistics.median(v[0]), statistics.median(v[1])) for k, v in table.items()}

def size(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"

print("# Across two network namespaces (veth), chorus (tcp) vs Open MPI (btl tcp,self)\n")
print(f"Ranks split evenly over two namespaces; medians of {rounds} interleaved rounds.")
print(f"Load: before `{before.strip()}`, after `{after.strip()}`.")
if mpi_reason:
    print(f"\nOpen MPI not measured: {mpi_reason}")
for ranks in (2, 4):
    n_c, c = medians("chorus", ranks)
    n_m, m = medians("mpi", ranks)
    print(f"\n## {ranks} ranks ({n_c} chorus runs, {n_m} Open MPI runs)\n")
    print("| size | mode | chorus µs | Open MPI µs | time ratio | chorus busbw GB/s | Open MPI busbw GB/s | busbw ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(set(c) | set(m)):
        ct, cb = c.get(key, (None, None))
        mt, mb = m.get(key, (None, None))
        f = lambda x, p=1: "–" if x is None else f"{x:.{p}f}"
        tr = f(ct / mt, 2) if ct and mt else "–"
        br = f(cb / mb, 2) if cb and mb else "–"
        mode = "in" if key[1] == "in_place" else "out"
        print(f"| {size(key[0])} | {mode} | {f(ct)} | {f(mt)} | {tr} | {f(cb, 3)} | {f(mb, 3)} | {br} |")
PY
say "report in $OUT/netns.md"
