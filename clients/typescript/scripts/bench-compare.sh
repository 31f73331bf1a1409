#!/usr/bin/env bash
# Workload (a) of lockd bench ("own": 16 clients, each its own lock and
# session, acquire+release pairs) for the Go client and the TypeScript
# client, one after the other against one fresh `lockd serve`, each in its
# own process. Prints both reports; compare "client cpu" µs/op with
# cpu_us_per_op. Usage: LOCKD_BIN=/path/to/lockd scripts/bench-compare.sh [seconds]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
: "${LOCKD_BIN:?set LOCKD_BIN to a lockd binary}"
secs="${1:-10}"
work="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
free() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
port="$(free)"; raft="$(free)"
"$LOCKD_BIN" serve --data-dir "$work/data" --listen "127.0.0.1:$port" --raft-listen "127.0.0.1:$raft" 2>"$work/serve.log" &
pid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
echo "== go client: lockd bench --workload own --clients 16 --duration ${secs}s"
"$LOCKD_BIN" bench --endpoints "127.0.0.1:$port" --workload own --clients 16 --duration "${secs}s"
echo "== typescript client: node bench.mjs --clients 16 --duration $secs"
(cd "$here" && LOCKD_ENDPOINTS="http://127.0.0.1:$port" node bench.mjs --clients 16 --duration "$secs")
