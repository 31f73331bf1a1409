#!/usr/bin/env bash
# A/B: this tree's lockd against an older commit's, on the workloads of
# `lockd bench` (own and one, 16 clients), server and clients as separate
# processes, alternating A B A B so that drift in the machine's speed falls
# on both. Each run starts a fresh one-node server in a temporary data dir
# on free 127.0.0.1 ports and stops it afterwards. Prints one line per run
# (pairs or grants per second, latency p50/p99 in ms, client CPU per op in
# µs, the server's CPU per op in µs) and the medians per binary.
#
#   bench/ab.sh 524aff0                      # 3 rounds of 10 s windows
#   ROUNDS=5 DURATION=20s bench/ab.sh v0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:?usage: bench/ab.sh BASE_COMMIT}"
rounds="${ROUNDS:-3}"
duration="${DURATION:-10s}"
work="$(mktemp -d)"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  git worktree remove --force "$work/base-src" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/new" ./cmd/lockd
git worktree add --detach -q "$work/base-src" "$base"
(cd "$work/base-src" && go build -o "$work/old" ./cmd/lockd)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# run BIN WORKLOAD: one fresh server, one bench; prints the result line.
run() {
  local bin="$1" workload="$2" api raft data
  api="$(port)"; raft="$(port)"; data="$work/data-$RANDOM"
  "$bin" serve --data-dir "$data" --listen "127.0.0.1:$api" --raft-listen "127.0.0.1:$raft" 2>"$work/serve.log" &
  pid=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$api/readyz" >/dev/null && break; sleep 0.05; done
  local t0 t1
  t0="$(awk '{print $14+$15}' "/proc/$pid/stat")"
  "$bin" bench --endpoints "127.0.0.1:$api" --workload "$workload" --clients 16 \
    --warmup 2s --duration "$duration" --json >"$work/out.json"
  t1="$(awk '{print $14+$15}' "/proc/$pid/stat")"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  rm -rf "$data"
  python3 - "$work/out.json" "$((t1 - t0))" "$(getconf CLK_TCK)" "$duration" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ticks, hz = int(sys.argv[2]), int(sys.argv[3])
ops = r["ops"]
rate = r["ops_per_second"]
lat = r.get("latency_us") or {}
p50 = round(lat.get("p50", 0) / 1000, 2)
p99 = round(lat.get("p99", 0) / 1000, 2)
cpu = round(r.get("client_cpu_us_per_op", 0), 1)
# The server's CPU over warm-up and window, per op of the window: an upper
# bound (the warm-up's ops are not counted).
srv = ticks / hz * 1e6 / ops if ops else 0
print(json.dumps({"rate": rate, "p50": p50, "p99": p99, "client_us_op": cpu, "server_us_op": round(srv, 1)}))
EOF
}

for workload in own one; do
  : >"$work/old-$workload"; : >"$work/new-$workload"
  for i in $(seq "$rounds"); do
    # Odd rounds old first, even rounds new first: neither is always the
    # one that runs on a warmer or cooler machine.
    order="old new"
    [ $((i % 2)) -eq 0 ] && order="new old"
    for b in $order; do
      line="$(run "$work/$b" "$workload")"
      echo "$workload $b round $i: $line"
      echo "$line" >>"$work/$b-$workload"
    done
  done
  for b in old new; do
    python3 - "$work/$b-$workload" "$b" "$workload" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda k: statistics.median([r[k] for r in rows if r.get(k) is not None] or [0])
print(f"median {sys.argv[3]} {sys.argv[2]}: rate {med('rate'):.0f}/s p50 {med('p50'):.2f} p99 {med('p99'):.2f} "
      f"client {med('client_us_op'):.1f} us/op server {med('server_us_op'):.1f} us/op")
EOF
  done
done
