#!/usr/bin/env bash
# bench/memory.sh — a node's memory with a big lock table. Starts one
# `lockd serve` and bench/cmd/memfill as separate processes on 127.0.0.1:
# memfill opens --sessions sessions over 10 clients (session streams) and
# takes --locks locks in each. Prints, for the server:
#   peak RSS while building (VmHWM from /proc/PID/status when the last lock
#   is held), RSS then, steady RSS (VmRSS --steady after that), and the
#   restart: the server is killed (-9) with the table built and started
#   again on its data dir; the time until /readyz answers, its RSS then and
#   its VmHWM --steady later, and where the start's time went (from the
#   server's log: restore, Raft's log scan, election wait, log applied).
# Heap profiles (the server's --pprof-listen) are saved in --profiles DIR:
# build-N.pb.gz every 20 s while building, built.pb.gz when the last lock is
# held, steady.pb.gz and restart.pb.gz (each after a forced collection, once
# the RSS is read); their top entries are printed.
#
#   bench/memory.sh [--sessions 1000] [--locks 1000] [--steady 30]
#                   [--lockd BIN] [--profiles DIR] [--build-limit 1200]
#                   [--restart-with BIN]... [--rounds 2] [-- SERVE-FLAGS...]
#
# Each --restart-with BIN (say, another commit's lockd) is then also
# restarted on the same data dir, --rounds rounds alternating with the
# --lockd one, each killed -9 before the next: restart A/B on one state.
# SERVE-FLAGS go to `lockd serve` (every start). The server's environment
# is this one's (GOGC, GOMEMLIMIT apply). Bounded: the build by
# --build-limit seconds, each start by 120 s; every process is stopped by
# its pid on exit.
set -euo pipefail
# The body is one block, read whole before it runs: editing this file
# while a run goes on cannot change that run.
{

SESSIONS=1000 LOCKS=1000 STEADY=30 LOCKD="" PROFILES="" BUILD_LIMIT=1200 ROUNDS=2
RESTART_WITH=()
ROOT=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
	case $1 in
	--sessions) SESSIONS=$2; shift 2 ;;
	--locks) LOCKS=$2; shift 2 ;;
	--steady) STEADY=$2; shift 2 ;;
	--lockd) LOCKD=$2; shift 2 ;;
	--profiles) PROFILES=$2; shift 2 ;;
	--build-limit) BUILD_LIMIT=$2; shift 2 ;;
	--restart-with) RESTART_WITH+=("$2"); shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--) shift; break ;;
	-h | --help) sed -n '2,27p' "$0"; exit 0 ;;
	*) echo "memory.sh: unknown argument $1" >&2; exit 64 ;;
	esac
done
SERVE_FLAGS=("$@")

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

WORK=$(mktemp -d /tmp/lockd-memory.XXXXXX)
[ -n "$PROFILES" ] || PROFILES=$(mktemp -d /tmp/lockd-memory-profiles.XXXXXX)
mkdir -p "$PROFILES"
SERVER_PID="" FILL_PID=""
cleanup() {
	for p in $FILL_PID $SERVER_PID; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building in $WORK"
if [ -z "$LOCKD" ]; then
	(cd "$ROOT" && timeout 600 go build -o "$WORK/lockd" ./cmd/lockd)
	LOCKD=$WORK/lockd
fi
[ -x "$LOCKD" ] || { echo "memory.sh: --lockd $LOCKD is not an executable" >&2; exit 64; }
(cd "$ROOT/bench" && timeout 600 go build -o "$WORK/memfill" ./cmd/memfill)

freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
API=$(freeport) RAFT=$(freeport) PPROF=$(freeport)
URL=http://127.0.0.1:$API
kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$SERVER_PID/status"; }
mib() { echo $((($(kib "$1") + 512) / 1024)); }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

serve() { # [BIN]
	LOG_FROM=$(($(wc -l <"$WORK/serve.log" 2>/dev/null || echo 0) + 1))
	"${1:-$LOCKD}" serve --data-dir "$WORK/data" --listen "127.0.0.1:$API" --raft-listen "127.0.0.1:$RAFT" \
		--pprof-listen "127.0.0.1:$PPROF" ${SERVE_FLAGS[@]+"${SERVE_FLAGS[@]}"} >>"$WORK/serve.log" 2>&1 &
	SERVER_PID=$!
	local t0 i
	t0=$(now)
	for i in $(seq 1200); do
		if curl -fsS -o /dev/null --max-time 1 "$URL/readyz" 2>/dev/null; then
			READY_SECONDS=$(elapsed "$t0")
			# CPU the server used until ready (user+sys), which a busy
			# machine does not stretch as it stretches the wall time.
			READY_CPU=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$SERVER_PID/stat")
			return 0
		fi
		kill -0 "$SERVER_PID" 2>/dev/null || break
		sleep 0.1
	done
	echo "memory.sh: server not ready after 120 s" >&2
	tail -20 "$WORK/serve.log" >&2
	exit 1
}
# phases: where the last start's time went, from its lines in the server's
# log: the snapshot's restore, Raft's scan of the log after it, the
# election timer, and the leader's start (the log applied).
phases() {
	tail -n "+$LOG_FROM" "$WORK/serve.log" | awk '
		{ if (!match($0, /^time=[^ ]+/)) next
		  split(substr($0, 6 + 11, 12), h, ":"); t = h[1] * 3600 + h[2] * 60 + h[3]
		  if (!match($0, /msg="[^"]*"/)) next
		  m = substr($0, RSTART + 5, RLENGTH - 6); if (!(m in at)) at[m] = t }
		function d(a, b) { return (a in at) && (b in at) ? sprintf("%.2f s", at[b] - at[a]) : "-" }
		END { printf "restore %s, config scan %s, election wait %s, leader until established %s\n",
			d("starting restore from snapshot", "restored from snapshot"), d("restored from snapshot", "initial configuration"),
			d("entering follower state", "entering leader state"), d("entering leader state", "leadership established") }'
}
# heap NAME [gc]: with gc, a collection first, so inuse is what is live now
# (else it is as of the last collection).
heap() { curl -fsS --max-time 60 -o "$PROFILES/$1.pb.gz" "http://127.0.0.1:$PPROF/debug/pprof/heap${2:+?gc=1}" || log "heap profile $1 failed"; }
# memstats NAME: the Go runtime's view (heap in use, idle, released to the
# OS, the next collection's goal) and the kernel's (anonymous and file-backed
# resident memory), so RSS beyond the live heap can be placed.
memstats() {
	echo "--- $1: $(awk '$1 ~ /^Rss(Anon|File):$/ { printf "%s %d MiB  ", $1, ($2 + 512) / 1024 }' "/proc/$SERVER_PID/status")"
	curl -fsS --max-time 60 "http://127.0.0.1:$PPROF/debug/pprof/heap?debug=1" 2>/dev/null |
		awk '$1 == "#" && $2 ~ /^(HeapAlloc|HeapSys|HeapIdle|HeapInuse|HeapReleased|StackSys|MSpanSys|GCSys|OtherSys|Sys|NextGC|NumGC)$/ { printf "%s %s  ", $2, ($4 ~ /^[0-9]+$/ && $4 > 1048576) ? int($4 / 1048576) "Mi" : $4 } END { print "" }'
}
ptop() {
	echo "--- heap profile $1 (inuse_space, top 12)"
	go tool pprof -sample_index=inuse_space -top -nodecount=12 "$PROFILES/$1.pb.gz" 2>/dev/null | sed -n '/^Showing\|flat%/,$p' || true
}

serve
log "server ready ($LOCKD $("$LOCKD" version 2>&1 | head -1)); building $SESSIONS sessions × $LOCKS locks"
"$WORK/memfill" --endpoint "$URL" --sessions "$SESSIONS" --locks "$LOCKS" \
	--build-limit "${BUILD_LIMIT}s" --hold 1h --ready "$WORK/ready" >"$WORK/fill.out" 2>"$WORK/fill.err" &
FILL_PID=$!
t0=$(now) n=0
while [ ! -e "$WORK/ready" ]; do
	kill -0 "$FILL_PID" 2>/dev/null || { echo "memory.sh: memfill exited:" >&2; cat "$WORK/fill.out" "$WORK/fill.err" >&2; exit 1; }
	kill -0 "$SERVER_PID" 2>/dev/null || { echo "memory.sh: server exited" >&2; tail -20 "$WORK/serve.log" >&2; exit 1; }
	sleep 1
	n=$((n + 1))
	[ $((n % 20)) != 0 ] || { heap "build-$n"; log "$(tail -1 "$WORK/fill.err") (server RSS $(mib VmRSS) MiB, peak $(mib VmHWM) MiB)"; }
done
BUILD_SECONDS=$(elapsed "$t0")
PEAK=$(mib VmHWM) AT_BUILT=$(mib VmRSS)
BUILD_CPU=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$SERVER_PID/stat")
heap built
log "built in $BUILD_SECONDS s; waiting $STEADY s"
sleep "$STEADY"
STEADY_RSS=$(mib VmRSS)
STEADY_STATS=$(memstats steady)
heap steady gc
SNAPS=$(grep -c "snapshot taken by log size" "$WORK/serve.log" || true)

log "kill -9 the server, restart"
kill -9 "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
serve
RESTART=$READY_SECONDS RESTART_CPU=$READY_CPU RESTART_PHASES=$(phases)
RESTART_RSS=$(mib VmRSS)
sleep "$STEADY"
heap restart gc
RESTART_STEADY=$(mib VmRSS) RESTART_PEAK=$(mib VmHWM)

echo "locks: $((SESSIONS * LOCKS)) ($SESSIONS sessions × $LOCKS), built in $BUILD_SECONDS s; serve flags: ${SERVE_FLAGS[*]:-(none)}; GOGC=${GOGC:-} GOMEMLIMIT=${GOMEMLIMIT:-}"
echo "build: peak RSS $PEAK MiB (VmHWM), RSS when built $AT_BUILT MiB, after ${STEADY} s $STEADY_RSS MiB; snapshots by log size: $SNAPS; server CPU until built $BUILD_CPU s"
echo "restart: ready in $RESTART s (server CPU $RESTART_CPU s), RSS then $RESTART_RSS MiB, after ${STEADY} s $RESTART_STEADY MiB (VmHWM $RESTART_PEAK MiB)"
echo "  $RESTART_PHASES"
if [ ${#RESTART_WITH[@]} -gt 0 ]; then
	for round in $(seq "$ROUNDS"); do
		for bin in "${RESTART_WITH[@]}" "$LOCKD"; do
			kill -9 "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
			serve "$bin"
			echo "restart round $round, $bin: ready in $READY_SECONDS s (server CPU $READY_CPU s), RSS then $(mib VmRSS) MiB"
			echo "  $(phases)"
		done
	done
fi
echo "$STEADY_STATS"
for p in built steady restart; do [ ! -s "$PROFILES/$p.pb.gz" ] || ptop "$p"; done
cp "$WORK/serve.log" "$PROFILES/serve.log"
echo "profiles and the server's log in $PROFILES"
exit
}
