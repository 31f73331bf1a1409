#!/bin/sh
# CPU per acquire+release pair, workload "own" (16 clients, own locks, own
# connections and sessions), Go client (lockd bench) beside the Python client
# (bench.py), each in its own process, against one lockd serve started here,
# with the session stream on and off. Usage: bench_compare.sh [LOCKD_BIN] [SECONDS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-}
secs=${2:-10}
tmp=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
if [ -z "$bin" ]; then
	bin="$tmp/lockd"
	(cd "$here/../.." && go build -o "$bin" ./cmd/lockd)
fi
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
raft=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --data-dir "$tmp/data" --listen "127.0.0.1:$port" --raft-listen "127.0.0.1:$raft" >"$tmp/log" 2>&1 &
pid=$!
i=0
until curl -fs "http://127.0.0.1:$port/readyz" >/dev/null; do
	i=$((i + 1)); [ $i -lt 300 ] || { cat "$tmp/log"; exit 1; }; sleep 0.1
done
url="http://127.0.0.1:$port"
# The server's CPU (user+sys, seconds) from /proc, around each run.
scpu() { awk '{printf "%.2f", ($14+$15)/'"$(getconf CLK_TCK)"'}' "/proc/$pid/stat"; }
for stream in on off; do
	echo "=== session stream $stream"
	echo "--- go (lockd bench --workload own --clients 16 --duration ${secs}s)"
	a=$(scpu)
	LOCKD_STREAM=$stream "$bin" bench --endpoints "$url" --workload own --clients 16 --duration "${secs}s" 2>&1 |
		grep -E '^(ops|latency|errors|client cpu)'
	echo "  server CPU over the whole run (warm-up included): $(echo "$(scpu) $a" | awk '{print $1-$2}') s"
	echo "--- python (bench.py --clients 16 --duration $secs)"
	a=$(scpu)
	LOCKD_STREAM=$stream /usr/bin/python3 "$here/bench.py" --endpoints "$url" --clients 16 --duration "$secs" --server-pid "$pid" | tail -n +2
	echo "  server CPU over the whole run (warm-up included): $(echo "$(scpu) $a" | awk '{print $1-$2}') s"
done
