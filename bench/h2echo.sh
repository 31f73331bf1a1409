#!/usr/bin/env bash
# Server CPU per call of HTTP/2 transports on a bidi stream shaped like
# lockd's session stream, without lockd behind it (bench/cmd/h2echo):
# Connect's handler on net/http's HTTP/2 server as is, the same with
# buffered reads (as lockd serves plaintext), grpc-go's transport, the
# Connect stream on an upgraded HTTP/1.1 connection (what lockd serves),
# and a lean framing (length-prefixed protobuf on TCP, no HTTP/2). One
# h2echo load process (16 streams, each its own connection, one call in
# flight each, the Connect client in its gRPC protocol) per run; the
# server's CPU is the utime+stime delta of its process (/proc/PID/stat)
# over the load, its read and write syscalls from /proc/PID/io. Rounds
# rotate the order of the servers.
#
#   bench/h2echo.sh                     # 3 rounds of 10 s
#   ROUNDS=5 DURATION=20s bench/h2echo.sh
set -euo pipefail
cd "$(dirname "$0")"
rounds="${ROUNDS:-3}"
duration="${DURATION:-10s}"
work="$(mktemp -d)"
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/h2echo" ./cmd/h2echo
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
impls=(nethttp nethttp-buf grpc upgrade lean)
for i in $(seq "$rounds"); do
  for k in 0 1 2 3 4; do
    impl="${impls[$(( (k + i) % 5 ))]}"
    p="$(port)"
    "$work/h2echo" serve --impl "$impl" --listen "127.0.0.1:$p" &
    pid=$!
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.05; done
    t0="$(awk '{print $14+$15}' "/proc/$pid/stat")"
    io0="$(awk '/^syscr/{r=$2} /^syscw/{w=$2} END{print r, w}' "/proc/$pid/io")"
    lean=""; case $impl in lean | upgrade) lean=--$impl ;; esac
    out="$("$work/h2echo" load --addr "127.0.0.1:$p" --streams 16 --duration "$duration" $lean)"
    t1="$(awk '{print $14+$15}' "/proc/$pid/stat")"
    io1="$(awk '/^syscr/{r=$2} /^syscw/{w=$2} END{print r, w}' "/proc/$pid/io")"
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    python3 - "$impl" "$out" "$((t1 - t0))" "$(getconf CLK_TCK)" "$io0" "$io1" <<'PY' | tee -a "$work/rows"
import json, sys
impl, r, ticks, hz = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r0, w0 = map(int, sys.argv[5].split()); r1, w1 = map(int, sys.argv[6].split())
n = r["calls"]
print(json.dumps({"impl": impl, "calls_per_second": r["calls_per_second"], "server_us_per_call": round(ticks / hz * 1e6 / n, 1),
                  "client_us_per_call": r["client_us_per_call"], "server_reads_per_call": round((r1 - r0) / n, 2),
                  "server_writes_per_call": round((w1 - w0) / n, 2)}))
PY
  done
done
python3 - "$work/rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| server | calls/s | server CPU µs/call | client CPU µs/call | server reads/call | server writes/call |")
print("|---|---:|---:|---:|---:|---:|")
for impl in ("nethttp", "nethttp-buf", "grpc", "upgrade", "lean"):
    rs = [r for r in rows if r["impl"] == impl]
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"| {impl} | {med('calls_per_second'):.0f} | {med('server_us_per_call'):.1f} | {med('client_us_per_call'):.1f} | "
          f"{med('server_reads_per_call'):.2f} | {med('server_writes_per_call'):.2f} |")
PY
