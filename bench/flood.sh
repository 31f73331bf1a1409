#!/usr/bin/env bash
# bench/flood.sh — a flood with real processes: one
# `lockd serve` (auth on, audit log on), a flooder process (--sessions
# sessions of one identity in TryLock loops on one lock, no backoff,
# limited by its identity's token bucket) and a well-behaved process (10
# clients locking and unlocking their own locks, first idle, then under
# the flood). Prints the good clients' p50/p99 idle and under flood, the
# ratio, the server's CPU, the flooder's counts, lockd_limit_hits_total
# and whether the server stayed up.
#
#   bench/flood.sh [--sessions 2000] [--flood-clients 1] [--clients 10]
#                  [--phase 5s] [--pin both|on|off] [--no-audit]
#                  [--profile FILE] [--lockd BINARY] [--rounds 5] [--window 2s]
#
# After the idle phase and the flood phase, the good process runs --rounds
# rounds of a --window with the flood then a --window with the flooder
# paused (it polls a pause file), measured apart: on a box shared with
# other work both then see the same background load, so the median of the
# rounds' p99 ratios is the figure to read (0 skips them).
#
# --pin on emulates attackers on other machines on this one box: the server
# runs on CPU 0 (taskset; other work on the box may share it), the good
# process and the flooder on CPU 1, the flooder under SCHED_IDLE and nice
# 19 (chrt --idle 0): it stands for other machines' CPU, so it only gets
# what the good clients leave and never delays their wake-ups. --pin off
# runs all three unpinned on every core, the flooder at normal priority
# (its CPU then competes with the server's and the good clients'). both
# (default) runs one then the other, each on a fresh server.
# --lockd BINARY runs that lockd binary instead of building ./cmd/lockd
# (to compare builds).
# --profile FILE saves a 5 s CPU profile of the server taken during the
# (last) flood phase (the server runs with --pprof-listen).
#
# LOCKD_STREAM=off in the environment makes both client processes use
# unary calls instead of the session stream.
#
# Bounded: every wait has a timeout; the server and the client processes
# are stopped by pid on exit, whatever happens; everything is in a
# temporary directory, removed on exit.
set -euo pipefail

SESSIONS=2000 FLOOD_CLIENTS=1 CLIENTS=10 PHASE=5s PIN=both AUDIT=1 PROFILE="" LOCKD_BIN="" ROUNDS=5 WINDOW=2s
ROOT=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
	case $1 in
	--sessions) SESSIONS=$2; shift 2 ;;
	--flood-clients) FLOOD_CLIENTS=$2; shift 2 ;;
	--clients) CLIENTS=$2; shift 2 ;;
	--phase) PHASE=$2; shift 2 ;;
	--pin) PIN=$2; shift 2 ;;
	--no-audit) AUDIT=0; shift ;;
	--profile) PROFILE=$(realpath -m "$2"); shift 2 ;;
	--lockd) LOCKD_BIN=$(realpath "$2"); shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--window) WINDOW=$2; shift 2 ;;
	-h | --help) sed -n '2,39p' "$0"; exit 0 ;;
	*) echo "flood.sh: unknown argument $1" >&2; exit 64 ;;
	esac
done
case $PIN in both) MODES="on off" ;; on | off) MODES=$PIN ;; *) echo "flood.sh: --pin both|on|off" >&2; exit 64 ;; esac

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

WORK=$(mktemp -d /tmp/lockd-flood.XXXXXX)
PIDS=()
stop_all() {
	local pid
	for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	PIDS=()
}
cleanup() { stop_all; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building lockd and flood in $WORK"
if [ -n "$LOCKD_BIN" ]; then
	cp "$LOCKD_BIN" "$WORK/lockd"
else
	(cd "$ROOT" && timeout 600 go build -o "$WORK/lockd" ./cmd/lockd)
fi
(cd "$ROOT/bench" && timeout 600 go build -o "$WORK/flood" ./cmd/flood)
(cd "$ROOT/bench" && timeout 600 go build -o "$WORK/compare" ./cmd/compare)

# Tokens: random, stored hashed in the auth file.
newtoken() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"; }
hashof() { printf 'sha256:%s' "$(sha256sum <"$1" | cut -d' ' -f1)"; }
newtoken "$WORK/flood.token"
newtoken "$WORK/good.token"
cat >"$WORK/auth" <<-EOF
	token $(hashof "$WORK/flood.token") flooder
	grant flooder lock
	token $(hashof "$WORK/good.token") good
	grant good lock good/
	limit good rate=100000
	limit flooder rate=200 burst=$((SESSIONS + 50)) sessions=$((SESSIONS + 10)) waits=100
EOF

wait_file() { # file seconds
	local i
	for i in $(seq $(($2 * 10))); do
		[ -e "$1" ] && return 0
		sleep 0.1
	done
	echo "flood.sh: $1 did not appear within $2 s" >&2
	return 1
}

secs() { "$WORK/compare" seconds "$1"; }

run_mode() { # on|off
	local pin=$1 d=$WORK/run-$1 port pport rport server good hammer
	local -a tserver=() tgood=() thammer=()
	if [ "$pin" = on ]; then
		tserver=(taskset -c 0) tgood=(taskset -c 1) thammer=(taskset -c 1 chrt --idle 0 nice -n 19)
	fi
	mkdir -p "$d"
	local -a ps
	mapfile -t ps < <("$WORK/compare" ports 3)
	port=${ps[0]} pport=${ps[1]} rport=${ps[2]}
	local -a audit=()
	[ "$AUDIT" = 1 ] && audit=(--audit-log "$d/audit.log")
	log "pin $pin: starting lockd serve on 127.0.0.1:$port"
	"${tserver[@]}" "$WORK/lockd" serve --data-dir "$d/data" --listen "127.0.0.1:$port" --raft-listen "127.0.0.1:$rport" \
		--auth-file "$WORK/auth" "${audit[@]}" --pprof-listen "127.0.0.1:$pport" --log-level warn >"$d/server.log" 2>&1 &
	server=$!
	PIDS+=("$server")
	local i
	for i in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz" 2>/dev/null && break
		[ "$i" = 300 ] && { echo "flood.sh: server not ready after 60 s" >&2; cat "$d/server.log" >&2; return 1; }
		sleep 0.2
	done
	local phase_s budget
	phase_s=$(secs "$PHASE")
	budget=$((2 * phase_s + 2 * ROUNDS * $(secs "$WINDOW") + 240))
	log "pin $pin: good clients, idle phase ($PHASE)"
	"${tgood[@]}" timeout "$budget" "$WORK/flood" good --endpoint "http://127.0.0.1:$port" --token-file "$WORK/good.token" \
		--clients "$CLIENTS" --phase "$PHASE" --idle-done "$d/idle-done" --wait-for "$d/flooding" --server-pid "$server" \
		--rounds "$ROUNDS" --window "$WINDOW" --pause-file "$d/pause" >"$d/good.out" &
	good=$!
	PIDS+=("$good")
	wait_file "$d/idle-done" $((phase_s + 120))
	log "pin $pin: flooder, $SESSIONS sessions over $FLOOD_CLIENTS clients"
	"${thammer[@]}" timeout "$budget" "$WORK/flood" hammer --endpoint "http://127.0.0.1:$port" --token-file "$WORK/flood.token" \
		--sessions "$SESSIONS" --clients "$FLOOD_CLIENTS" --duration "$((phase_s + 2 * ROUNDS * $(secs "$WINDOW") + 180))s" --ready "$d/flooding" \
		--pause-file "$d/pause" >"$d/hammer.out" &
	hammer=$!
	PIDS+=("$hammer")
	wait_file "$d/flooding" 180
	log "pin $pin: flood phase ($PHASE)"
	if [ -n "$PROFILE" ] && [ "$phase_s" -ge 6 ]; then
		curl -fsS --max-time 30 -o "$PROFILE" "http://127.0.0.1:$pport/debug/pprof/profile?seconds=$((phase_s - 1))" || true
	fi
	wait "$good"
	kill -TERM "$hammer" 2>/dev/null || true
	wait "$hammer" || true
	local up=no
	kill -0 "$server" 2>/dev/null && up=yes
	echo "### pin $pin$([ "$pin" = on ] && echo ": server on CPU 0; good clients and flooder (SCHED_IDLE) on CPU 1")"
	echo
	echo '```'
	cat "$d/good.out" "$d/hammer.out"
	echo "server process alive after the run: $up"
	if [ "$AUDIT" = 1 ]; then
		echo "audit log: $(wc -l <"$d/audit.log") lines, $(grep -c '"code":"resource_exhausted"' "$d/audit.log" || true) of them limit refusals"
	fi
	echo '```'
	echo
	stop_all
}

echo "## Flood run $(date -u +'%Y-%m-%d %H:%M UTC'), $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo
echo "Command: \`bench/flood.sh --sessions $SESSIONS --flood-clients $FLOOD_CLIENTS --clients $CLIENTS --phase $PHASE --rounds $ROUNDS --window $WINDOW --pin $PIN$([ "$AUDIT" = 0 ] && echo ' --no-audit')$([ -n "$LOCKD_BIN" ] && echo " --lockd $LOCKD_BIN")\`$([ -n "${LOCKD_STREAM:-}" ] && echo " with LOCKD_STREAM=$LOCKD_STREAM")."
echo "Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before."
echo
for m in $MODES; do run_mode "$m"; done
