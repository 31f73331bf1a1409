#!/usr/bin/env bash
# bench/listlocks.sh — do read-only ListLocks callers slow
# a good client's locks when the table is big? Runs `lockd serve` and
# `lockd bench --workload listlocks` as separate processes on 127.0.0.1:
# the bench holds --locks locks from a few sessions, then runs --rounds
# rounds of three phases (4 readers calling ListLocks{page_size:1} at
# 190/s each on the held locks' prefix; the same on a prefix that matches
# nothing; no readers; the order rotates by round) while one good client
# takes and releases its own lock, and reports the good client's p50/p99
# in each and the p99 ratio match/none.
#
#   bench/listlocks.sh [--server BIN]... [--passes 2] [--locks 100000]
#                      [--rounds 3] [--duration 5s] [--warmup 1s]
#                      [--out FILE]
#
# Each --server is a `lockd` binary to serve with (default: one built from
# this tree); with several, each pass runs them one after another
# (before/after/before/after when given main's and this tree's), each on a
# fresh data directory. The bench client is always built from this tree.
# Prints one summary line per run (and the JSON reports to --out, if
# given). Bounded: each server start 60 s, each bench run a timeout from
# its settings; servers are stopped by their pid on exit.
set -euo pipefail

PASSES=2 LOCKS=100000 ROUNDS=3 DURATION=5s WARMUP=1s OUT=""
SERVERS=()
ROOT=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
	case $1 in
	--server) SERVERS+=("$2"); shift 2 ;;
	--passes) PASSES=$2; shift 2 ;;
	--locks) LOCKS=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--duration) DURATION=$2; shift 2 ;;
	--warmup) WARMUP=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	-h | --help) sed -n '2,23p' "$0"; exit 0 ;;
	*) echo "listlocks.sh: unknown argument $1" >&2; exit 64 ;;
	esac
done

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

WORK=$(mktemp -d /tmp/lockd-listlocks.XXXXXX)
SERVER_PID=""
cleanup() {
	if [ -n "$SERVER_PID" ]; then kill -9 "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building lockd in $WORK"
(cd "$ROOT" && timeout 600 go build -o "$WORK/lockd" ./cmd/lockd)
[ ${#SERVERS[@]} -gt 0 ] || SERVERS=("$WORK/lockd")

freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
secs() { # "5s" / "500ms" -> whole seconds, rounded up
	case $1 in
	*ms) echo $(((${1%ms} + 999) / 1000)) ;;
	*s) echo "${1%s}" | cut -d. -f1 ;;
	*) echo 60 ;;
	esac
}
LIMIT=$((600 + ROUNDS * 2 * ($(secs "$DURATION") + $(secs "$WARMUP") + 15)))

run=0
for pass in $(seq "$PASSES"); do
	for bin in "${SERVERS[@]}"; do
		run=$((run + 1))
		d=$WORK/run$run
		mkdir -p "$d"
		api=$(freeport) raft=$(freeport)
		"$bin" serve --data-dir "$d/data" --listen "127.0.0.1:$api" --raft-listen "127.0.0.1:$raft" >"$d/serve.log" 2>&1 &
		SERVER_PID=$!
		ok=0
		for _ in $(seq 300); do
			if curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$api/readyz" 2>/dev/null; then ok=1; break; fi
			sleep 0.2
		done
		[ "$ok" = 1 ] || { echo "listlocks.sh: $bin not ready after 60s" >&2; cat "$d/serve.log" >&2; exit 1; }
		log "pass $pass: server $bin ($("$bin" version 2>&1 | head -1))"
		timeout "$LIMIT" "$WORK/lockd" bench --json --endpoints "127.0.0.1:$api" --workload listlocks \
			--locks "$LOCKS" --rounds "$ROUNDS" --duration "$DURATION" --warmup "$WARMUP" >"$d/report.json"
		kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""
		[ -z "$OUT" ] || { jq -c --arg server "$bin" --argjson pass "$pass" '. + {server: $server, pass: $pass}' "$d/report.json" >>"$OUT"; }
		jq -r --arg server "$bin" --argjson pass "$pass" \
			'"pass \($pass) \($server): \(.locks) locks (setup \(.setup_seconds | floor) s); good p50/p99 match \(.match.good_pair.p50_ms) / \(.match.good_pair.p99_ms) ms, none \(.none.good_pair.p50_ms) / \(.none.good_pair.p99_ms) ms, idle \(.idle.good_pair.p50_ms) / \(.idle.good_pair.p99_ms) ms; ratio \(.p99_ratio * 100 | round / 100)× (rounds \([.round_p99_ratios[] | (. * 100 | round / 100 | tostring)] | join(" ")) ); reader p99 match \(.match.reader_call.p99_ms) none \(.none.reader_call.p99_ms) ms, \(.match.reader_calls_per_second_each | round)/\(.none.reader_calls_per_second_each | round) calls/s each; errors \(.match.errors + .none.errors) \(.match.error_sample // "") \(.none.error_sample // "")"' \
			"$d/report.json"
	done
done
