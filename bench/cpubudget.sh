#!/usr/bin/env bash
# CPU budget per operation, per component, server and client: a one-node
# `lockd serve` and one `lockd bench` (16 clients) as separate processes,
# a CPU profile of each, and the table of bench/cmd/cpubudget. Each round
# starts a fresh server in a temporary data dir on free 127.0.0.1 ports and
# stops it (by pid) afterwards. The server's CPU per op is the utime+stime
# delta of its process (/proc/PID/stat) over the profiled part of the
# window, divided by the ops of that part (the window's rate × its
# length); the client's is the bench's own (getrusage over the window).
# Read and write syscalls per op of each process come from /proc/PID/io
# (syscr, syscw) over the same part. The profiles only split those totals
# into components.
#
#   bench/cpubudget.sh                          # 3 rounds of workload own, 10 s windows
#   ROUNDS=5 WORKLOAD=one bench/cpubudget.sh
#   LOCKD=/tmp/lockd-old KEEP=/tmp/prof bench/cpubudget.sh   # another build; keep the profiles
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-3}"
duration="${DURATION:-10}"   # seconds of the measured window
warmup="${WARMUP:-2}"        # seconds
workload="${WORKLOAD:-own}"
clients="${CLIENTS:-16}"
work="$(mktemp -d)"
pid=""
bpid=""
cleanup() {
  [ -n "$bpid" ] && kill "$bpid" 2>/dev/null && wait "$bpid" 2>/dev/null
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/*.prof "$work"/*.json "$KEEP"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

lockd="${LOCKD:-}"
if [ -z "$lockd" ]; then
  go build -o "$work/lockd" ./cmd/lockd
  lockd="$work/lockd"
fi
(cd bench && go build -o "$work/cpubudget" ./cmd/cpubudget)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
sysrw() { awk '/^syscr/{r=$2} /^syscw/{w=$2} END{print r, w}' "/proc/$1/io"; }
# raftlog PORT: Raft log entries and batches written (each batch one fsync).
raftlog() { curl -sf "http://127.0.0.1:$1/metrics" | awk '/^lockd_raft_log_entries_total /{e=$2} /^lockd_raft_log_batches_total /{b=$2} END{print e+0, b+0}'; }

# The profiled part of the window: from 1 s into it to 1 s before its end.
prof_secs=$((duration - 2))
[ "$prof_secs" -ge 2 ] || { echo "DURATION must be at least 4 (seconds)" >&2; exit 2; }
: >"$work/runs"
for i in $(seq "$rounds"); do
  api="$(port)"; raft="$(port)"; pp="$(port)"; data="$work/data-$i"
  "$lockd" serve --data-dir "$data" --listen "127.0.0.1:$api" --raft-listen "127.0.0.1:$raft" \
    --pprof-listen "127.0.0.1:$pp" --log-level warn 2>"$work/serve.log" &
  pid=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$api/readyz" >/dev/null && break; sleep 0.05; done
  "$lockd" bench --endpoints "127.0.0.1:$api" --workload "$workload" --clients "$clients" \
    --warmup "${warmup}s" --duration "${duration}s" --json --cpuprofile "$work/client-$i.prof" >"$work/run-$i.json" &
  bpid=$!
  # Session opening takes well under a second; the window starts after
  # the warm-up.
  sleep "$((warmup + 1))"
  t0="$(ticks "$pid")"; s0="$(sysrw "$pid")"; c0="$(sysrw "$bpid")"; l0="$(raftlog "$api")"
  curl -sf -o "$work/server-$i.prof" "http://127.0.0.1:$pp/debug/pprof/profile?seconds=$prof_secs"
  t1="$(ticks "$pid")"; s1="$(sysrw "$pid")"; c1="$(sysrw "$bpid")"; l1="$(raftlog "$api")"
  wait "$bpid"; bpid=""
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  rm -rf "$data"
  python3 - "$work/run-$i.json" "$((t1 - t0))" "$(getconf CLK_TCK)" "$prof_secs" "$s0" "$s1" "$c0" "$c1" "$l0" "$l1" >>"$work/runs" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ticks, hz, secs = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s0, s1, c0, c1, l0, l1 = ([int(float(x)) for x in a.split()] for a in sys.argv[5:11])
ops = r["ops_per_second"] * secs
print(json.dumps({
    "rate": r["ops_per_second"], "errors": r.get("errors", 0),
    "server_us": ticks / hz * 1e6 / ops, "client_us": r.get("client_cpu_us_per_op", 0),
    "server_reads": (s1[0] - s0[0]) / ops, "server_writes": (s1[1] - s0[1]) / ops,
    "client_reads": (c1[0] - c0[0]) / ops, "client_writes": (c1[1] - c0[1]) / ops,
    "entries_per_batch": (l1[0] - l0[0]) / max(1, l1[1] - l0[1]), "fsyncs": (l1[1] - l0[1]) / ops,
}))
EOF
  tail -1 "$work/runs" >&2
done

python3 - "$work/runs" "$workload" "$clients" >"$work/summary" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda k: statistics.median(r[k] for r in rows)
errs = sum(sum(e.values()) if isinstance(e, dict) else e for e in (r["errors"] for r in rows))
rng = lambda k, f: f"{min(r[k] for r in rows):{f}}–{max(r[k] for r in rows):{f}}"
print(f"workload {sys.argv[2]}, {sys.argv[3]} clients, 1 node, {len(rows)} rounds: "
      f"ops/s {rng('rate', '.0f')}, server CPU µs/op {rng('server_us', '.1f')} (median {med('server_us'):.1f}), "
      f"client CPU µs/op {rng('client_us', '.1f')} (median {med('client_us'):.1f}), errors {errs}")
print(f"syscalls per op (median): server read {med('server_reads'):.2f} write {med('server_writes'):.2f}; "
      f"client read {med('client_reads'):.2f} write {med('client_writes'):.2f}; "
      f"Raft log: {med('entries_per_batch'):.1f} entries per batch (one fsync each), {med('fsyncs'):.2f} fsyncs per op")
print(f"{med('server_us'):.3f} {med('client_us'):.3f}")
EOF
head -2 "$work/summary"
echo
read -r sus cus < <(tail -1 "$work/summary")
srv="$(ls "$work"/server-*.prof | paste -sd,)"
cli="$(ls "$work"/client-*.prof | paste -sd,)"
"$work/cpubudget" --server-us "$sus" --client-us "$cus" "$srv" "$cli"
