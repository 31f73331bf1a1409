#!/usr/bin/env bash
# bench/multilock.sh — the multi-lock soak: --workers worker processes
# (8) take random sets of 2 or 3 of 5 locks (bench/set-0..4) in random
# order with MultiLock for --duration (60 s) on a 3-node lockd cluster
# (--nodes 1: one node), while a watcher process follows the locks'
# GRANTED events; then the checker joins the workers' records with the
# watched grants. Every process is its own, on 127.0.0.1 only:
#   nodes: `lockd serve` (the second and third --join the first);
#   workers: `multilock worker` (bench/cmd/multilock), one client and
#     session each; Lock bounded by --timeout (5s, counted), each set held
#     a random 0..2 ms; one JSON line per set (names, tokens, wall time
#     after Lock returned and just before Unlock);
#   watcher: `multilock watch`, Client.Watch of bench/set- with its state;
#     checks that each session's grants in one log entry are a whole set.
# The checker prints sets granted, sets/s, p50/p99 of the wait in Lock,
# timeouts and violations, and exits 1 on any violation: a set granted in
# part (its locks over more than one entry, or a name without a token),
# two holds of one name overlapping, or tokens not rising with acquisition
# time.
#
#   bench/multilock.sh [--duration 60s] [--workers 8] [--nodes 3]
#                      [--timeout 5s] [--lockd BIN] [--keep DIR]
#
# Bounded: builds by 600 s each, starts by 60 s, the workers by --duration
# + 120 s, the watcher's end by 90 s; every process is stopped by its pid
# on exit. --keep DIR keeps the records, the watch and the servers' logs.
set -euo pipefail
# The body is one block, read whole before it runs.
{

DURATION=60s WORKERS=8 NODES=3 TIMEOUT=5s LOCKD="" KEEP=""
ROOT=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
	case $1 in
	--duration) DURATION=$2; shift 2 ;;
	--workers) WORKERS=$2; shift 2 ;;
	--nodes) NODES=$2; shift 2 ;;
	--timeout) TIMEOUT=$2; shift 2 ;;
	--lockd) LOCKD=$2; shift 2 ;;
	--keep) KEEP=$2; shift 2 ;;
	-h | --help) sed -n '2,26p' "$0"; exit 0 ;;
	*) echo "multilock.sh: unknown argument $1" >&2; exit 64 ;;
	esac
done
case $NODES in 1 | 3) ;; *) echo "multilock.sh: --nodes is 1 or 3" >&2; exit 64 ;; esac

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

WORK=$(mktemp -d /tmp/lockd-multilock.XXXXXX)
PIDS=() WORKER_PIDS=() WATCH_PID=""
cleanup() {
	local p
	for p in "${WORKER_PIDS[@]}" $WATCH_PID "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	for p in "${WORKER_PIDS[@]}" $WATCH_PID "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -n "$KEEP" ]; then
		mkdir -p "$KEEP"
		cp -r "$WORK"/*.jsonl "$WORK"/*.err "$WORK"/n*/log* "$KEEP"/ 2>/dev/null || true
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building in $WORK"
if [ -z "$LOCKD" ]; then
	(cd "$ROOT" && timeout 600 go build -o "$WORK/lockd" ./cmd/lockd)
	LOCKD=$WORK/lockd
fi
[ -x "$LOCKD" ] || { echo "multilock.sh: --lockd $LOCKD is not an executable" >&2; exit 64; }
(cd "$ROOT/bench" && timeout 600 go build -o "$WORK/multilock" ./cmd/multilock)
ML=$WORK/multilock

freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() { # URL: until it answers 200, at most 60 s
	local i
	for i in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
		sleep 0.2
	done
	echo "multilock.sh: $1 not ready after 60 s" >&2
	tail -20 "$WORK"/n*/log >&2 || true
	exit 1
}

# The nodes, as bench/run.sh starts them: node 1 bootstraps, the others
# join it (then every node must answer /readyz).
EPS="" JOIN="" URLS=()
for i in $(seq "$NODES"); do
	api=$(freeport) raft=$(freeport)
	mkdir -p "$WORK/n$i"
	extra=(--node-id "n$i")
	[ -z "$JOIN" ] || extra+=(--join "$JOIN")
	"$LOCKD" serve --data-dir "$WORK/n$i/data" --listen "127.0.0.1:$api" --raft-listen "127.0.0.1:$raft" \
		"${extra[@]}" >"$WORK/n$i/log" 2>&1 &
	PIDS+=($!)
	if [ "$i" = 1 ]; then wait_http "http://127.0.0.1:$api/readyz"; else wait_http "http://127.0.0.1:$api/healthz"; fi
	JOIN+="${JOIN:+,}http://127.0.0.1:$api"
	EPS+="${EPS:+,}http://127.0.0.1:$api"
	URLS+=("http://127.0.0.1:$api")
done
for u in "${URLS[@]}"; do wait_http "$u/readyz"; done
log "$NODES node(s) ready: $EPS ($("$LOCKD" version 2>&1 | head -1))"

"$ML" watch --endpoints "$EPS" --out "$WORK/watch.jsonl" --ready "$WORK/watch.ready" >"$WORK/watch.err" 2>&1 &
WATCH_PID=$!
for i in $(seq 600); do
	[ ! -e "$WORK/watch.ready" ] || break
	kill -0 "$WATCH_PID" 2>/dev/null || { echo "multilock.sh: the watcher exited" >&2; cat "$WORK/watch.err" >&2; exit 1; }
	sleep 0.1
done
[ -e "$WORK/watch.ready" ] || { echo "multilock.sh: the watch not in place after 60 s" >&2; exit 1; }

log "watch in place; $WORKERS workers for $DURATION"
LIMIT=$(( $(python3 -c "import sys; d=sys.argv[1]; print(int(float(d[:-1]) * {'s':1,'m':60,'h':3600}[d[-1]]))" "$DURATION") + 120 ))
FILES=()
for i in $(seq "$WORKERS"); do
	timeout -s KILL "$LIMIT" "$ML" worker --endpoints "$EPS" --id "$i" --duration "$DURATION" --timeout "$TIMEOUT" \
		--seed "$RANDOM" --out "$WORK/worker-$i.jsonl" 2>"$WORK/worker-$i.err" &
	WORKER_PIDS+=($!)
	FILES+=("$WORK/worker-$i.jsonl")
done
FAILED=0
for p in "${WORKER_PIDS[@]}"; do wait "$p" || FAILED=$((FAILED + 1)); done
WORKER_PIDS=()
[ "$FAILED" = 0 ] || { log "$FAILED worker(s) failed:"; cat "$WORK"/worker-*.err >&2; }

log "workers done; ending the watch (it takes bench/set-end and reads up to its grant)"
kill -TERM "$WATCH_PID"
WRC=0
for i in $(seq 900); do kill -0 "$WATCH_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$WATCH_PID" 2>/dev/null && { log "the watcher did not end in 90 s"; kill -9 "$WATCH_PID"; }
wait "$WATCH_PID" || WRC=$?
WATCH_PID=""
[ "$WRC" = 0 ] || { log "the watcher failed ($WRC):"; cat "$WORK/watch.err" >&2; }
cat "$WORK"/worker-*.err >&2 || true

echo "multilock: $NODES node(s), $WORKERS workers, $DURATION, sets of 2-3 of bench/set-0..4, Lock timeout $TIMEOUT, hold 0-2 ms"
RC=0
"$ML" check --watch "$WORK/watch.jsonl" "${FILES[@]}" || RC=$?
[ "$FAILED" = 0 ] && [ "$WRC" = 0 ] || RC=1
exit "$RC"
}
