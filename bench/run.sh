#!/usr/bin/env bash
# bench/run.sh — the comparison harness: lockd (1 and 3 nodes)
# beside Redis (AOF appendfsync always), etcd (1 and 3 members) and
# ZooKeeper (1 and 3 servers), all real processes on 127.0.0.1, the same
# workloads (own locks, one lock, handoff latency), the same workers, the
# same duration, in one run of several passes. Writes bench/RESULTS.md.
#
#   bench/run.sh [--duration 10s] [--warmup 2s] [--clients 16] [--passes 2]
#                [--ttl 10s] [--sessions 10000] [--no-install] [--out bench/RESULTS.md]
#
# --sessions N also runs workload (d) on lockd and etcd, one node each: N
# sessions (etcd: leases) at --ttl kept alive for 20 s after a 10 s
# creation warm-up, with the server's CPU and memory read from /proc
# (0 skips it).
#
# Idempotent: every server runs in a fresh temporary directory on free
# ports and is stopped (by its pid) on exit, whatever happens; the only
# lasting effects are the Debian packages and the output file. Bounded:
# each server start, each measurement and the install have a timeout.
set -euo pipefail

DURATION=10s WARMUP=2s CLIENTS=16 PASSES=2 TTL=10s INSTALL=1 SESSIONS=10000
SESSIONS_WARMUP=${SESSIONS_WARMUP:-10} SESSIONS_DURATION=${SESSIONS_DURATION:-20} # seconds
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/bench/RESULTS.md
CMDLINE="bench/run.sh $*"
while [ $# -gt 0 ]; do
	case $1 in
	--duration) DURATION=$2; shift 2 ;;
	--warmup) WARMUP=$2; shift 2 ;;
	--clients) CLIENTS=$2; shift 2 ;;
	--passes) PASSES=$2; shift 2 ;;
	--ttl) TTL=$2; shift 2 ;;
	--sessions) SESSIONS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--no-install) INSTALL=0; shift ;;
	-h | --help) sed -n '2,20p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 64 ;;
	esac
done

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

# --- install ---------------------------------------------------------------
# None of these packages starts a service here; the script starts its own.
if [ "$INSTALL" = 1 ] && ! { command -v redis-server && command -v etcd && [ -f /usr/share/java/zookeeper.jar ] && command -v java; } >/dev/null; then
	log "installing redis-server etcd-server zookeeper"
	export DEBIAN_FRONTEND=noninteractive
	timeout -k 10 600 apt-get install -y --no-install-recommends redis-server etcd-server zookeeper ||
		{ timeout -k 10 300 apt-get update && timeout -k 10 600 apt-get install -y --no-install-recommends redis-server etcd-server zookeeper; }
fi

WORK=$(mktemp -d /tmp/lockd-bench.XXXXXX)
PIDS=()
BENCH_PID= # the sessions workload's client, run in the background
WRITING=   # set while $OUT.tmp is being written
cleanup() {
	local pid
	# BENCH_PID is a timeout(1), which passes TERM on to its client (KILL
	# would leave the client running).
	if [ -n "$BENCH_PID" ]; then
		kill "$BENCH_PID" 2>/dev/null || true
		wait "$BENCH_PID" 2>/dev/null || true
	fi
	for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$WORK"
	# A run that failed while writing its page leaves no half page.
	if [ -n "$WRITING" ]; then rm -f "$OUT.tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build -----------------------------------------------------------------
log "building lockd and compare in $WORK"
(cd "$ROOT" && timeout -k 10 600 go build -o "$WORK/lockd" ./cmd/lockd)
(cd "$ROOT/bench" && timeout -k 10 600 go build -o "$WORK/compare" ./cmd/compare)
LOCKD=$WORK/lockd COMPARE=$WORK/compare
mkdir -p "$WORK/results"

ports() { "$COMPARE" ports "$1"; }

# stop_all kills the servers of the current system and waits for them.
stop_all() {
	local pid
	for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	PIDS=()
}

# wait_http polls URL until it answers 200, for at most 60 s.
wait_http() {
	local i
	for i in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
		sleep 0.2
	done
	echo "run.sh: $1 not ready after 60s" >&2
	return 1
}

# --- servers ---------------------------------------------------------------
# Each start_* sets ENDPOINTS.

start_redis() {
	local d=$WORK/redis p
	rm -rf "$d"; mkdir -p "$d"
	p=$(ports 1)
	redis-server --port "$p" --bind 127.0.0.1 --dir "$d" --save '' \
		--appendonly yes --appendfsync always --protected-mode no --daemonize no \
		>"$d/log" 2>&1 &
	PIDS+=($!)
	ENDPOINTS=127.0.0.1:$p
	timeout -k 10 70 "$COMPARE" wait --system redis --endpoints "$ENDPOINTS"
}

start_etcd() { # n
	local n=$1 i cluster="" eps=""
	local -a cp pp
	mapfile -t cp < <(ports "$n")
	mapfile -t pp < <(ports "$n")
	for i in $(seq "$n"); do cluster+="${cluster:+,}e$i=http://127.0.0.1:${pp[i-1]}"; done
	for i in $(seq "$n"); do
		local d=$WORK/etcd$n-$i
		rm -rf "$d"; mkdir -p "$d"
		etcd --name "e$i" --data-dir "$d/data" \
			--listen-client-urls "http://127.0.0.1:${cp[i-1]}" --advertise-client-urls "http://127.0.0.1:${cp[i-1]}" \
			--listen-peer-urls "http://127.0.0.1:${pp[i-1]}" --initial-advertise-peer-urls "http://127.0.0.1:${pp[i-1]}" \
			--initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "bench$n" \
			>"$d/log" 2>&1 &
		PIDS+=($!)
		eps+="${eps:+,}127.0.0.1:${cp[i-1]}"
	done
	ENDPOINTS=$eps
	timeout -k 10 70 "$COMPARE" wait --system etcd --endpoints "$ENDPOINTS"
}

start_zookeeper() { # n
	local n=$1 i servers="" eps=""
	local -a cp qp ep
	mapfile -t cp < <(ports "$n")
	mapfile -t qp < <(ports "$n")
	mapfile -t ep < <(ports "$n")
	if [ "$n" -gt 1 ]; then
		for i in $(seq "$n"); do servers+="server.$i=127.0.0.1:${qp[i-1]}:${ep[i-1]}"$'\n'; done
	fi
	for i in $(seq "$n"); do
		local d=$WORK/zk$n-$i
		rm -rf "$d"; mkdir -p "$d/data"
		echo "$i" >"$d/data/myid"
		# forceSync=yes (the default): every transaction is fsynced.
		cat >"$d/zoo.cfg" <<-EOF
			tickTime=2000
			initLimit=10
			syncLimit=5
			dataDir=$d/data
			clientPortAddress=127.0.0.1
			clientPort=${cp[i-1]}
			admin.enableServer=false
			forceSync=yes
			maxClientCnxns=0
			$servers
		EOF
		java -Xmx256m -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar \
			-Dzookeeper.log.dir="$d" -Dzookeeper.root.logger=WARN,CONSOLE \
			org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg" >"$d/log" 2>&1 &
		PIDS+=($!)
		eps+="${eps:+,}127.0.0.1:${cp[i-1]}"
	done
	ENDPOINTS=$eps
	timeout -k 10 70 "$COMPARE" wait --system zookeeper --endpoints "$ENDPOINTS"
}

start_lockd() { # n
	local n=$1 i eps="" join=""
	local -a ap rp
	mapfile -t ap < <(ports "$n")
	mapfile -t rp < <(ports "$n")
	for i in $(seq "$n"); do
		local d=$WORK/lockd$n-$i
		rm -rf "$d"; mkdir -p "$d"
		local -a extra=(--node-id "n$i")
		[ -n "$join" ] && extra+=(--join "$join")
		"$LOCKD" serve --data-dir "$d/data" --listen "127.0.0.1:${ap[i-1]}" --raft-listen "127.0.0.1:${rp[i-1]}" \
			"${extra[@]}" >"$d/log" 2>&1 &
		PIDS+=($!)
		if [ "$i" = 1 ]; then
			wait_http "http://127.0.0.1:${ap[0]}/readyz"
		else
			wait_http "http://127.0.0.1:${ap[i-1]}/healthz"
		fi
		join+="${join:+,}http://127.0.0.1:${ap[i-1]}"
		eps+="${eps:+,}127.0.0.1:${ap[i-1]}"
	done
	ENDPOINTS=$eps
}

# --- measure ---------------------------------------------------------------

bench_limit() { # seconds a run may take: warm-up + duration + slack
	echo $(( $("$COMPARE" seconds "$WARMUP") + $("$COMPARE" seconds "$DURATION") + 120 ))
}

measure() { # pass system nodes
	local pass=$1 system=$2 nodes=$3 wl out
	for wl in own one handoff; do
		out=$WORK/results/p${pass}_${system}_${nodes}_${wl}.json
		log "pass $pass: $system x$nodes, workload $wl"
		local -a args=(--json --workload "$wl" --clients "$CLIENTS" --duration "$DURATION" --warmup "$WARMUP" --ttl "$TTL" --endpoints "$ENDPOINTS")
		if [ "$system" = lockd ]; then
			timeout -k 10 "$(bench_limit)" "$LOCKD" bench "${args[@]}" >"$out"
		else
			timeout -k 10 "$(bench_limit)" "$COMPARE" run --system "$system" "${args[@]}" >"$out"
		fi
	done
}

# cpu_ticks prints the user+system clock ticks of the processes given.
cpu_ticks() {
	local pid t=0
	for pid in "$@"; do
		# Fields 14 and 15 of /proc/PID/stat, counted after the ")" that
		# ends the command name.
		t=$((t + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
	done
	echo "$t"
}

# measure_sessions runs workload (d) and samples the server processes'
# CPU over the window and their peak resident memory at its end.
measure_sessions() { # pass system
	local pass=$1 system=$2 out bpid c0 c1 rss=0 pid hz
	out=$WORK/results/p${pass}_${system}_1_sessions.json
	log "pass $pass: $system x1, workload sessions ($SESSIONS)"
	local -a args=(--json --workload sessions --sessions "$SESSIONS" --clients "$CLIENTS" --ttl "$TTL"
		--warmup "${SESSIONS_WARMUP}s" --duration "${SESSIONS_DURATION}s" --endpoints "$ENDPOINTS")
	if [ "$system" = lockd ]; then
		timeout -k 10 $((SESSIONS_WARMUP + SESSIONS_DURATION + 120)) "$LOCKD" bench "${args[@]}" >"$out" &
	else
		timeout -k 10 $((SESSIONS_WARMUP + SESSIONS_DURATION + 120)) "$COMPARE" run --system "$system" "${args[@]}" >"$out" &
	fi
	bpid=$!
	BENCH_PID=$bpid
	sleep "$SESSIONS_WARMUP"
	c0=$(cpu_ticks "${PIDS[@]}")
	sleep "$SESSIONS_DURATION"
	c1=$(cpu_ticks "${PIDS[@]}")
	for pid in "${PIDS[@]}"; do
		rss=$((rss + $(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status")))
	done
	BENCH_PID=
	wait "$bpid"
	hz=$(getconf CLK_TCK)
	printf '{"server_cpu_percent": %s, "server_max_rss_bytes": %d}\n' \
		"$(awk -v d=$((c1 - c0)) -v hz="$hz" -v s="$SESSIONS_DURATION" 'BEGIN { printf "%.1f", 100 * d / hz / s }')" \
		$((rss * 1024)) >"$WORK/results/server_p${pass}_${system}_1_sessions.json"
}

START=$(date -u +'%Y-%m-%d %H:%M UTC')
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for pass in $(seq "$PASSES"); do
	for sys in "lockd 1" "redis 1" "etcd 1" "zookeeper 1" "lockd 3" "etcd 3" "zookeeper 3"; do
		set -- $sys
		if [ "$1" = redis ]; then start_redis; else "start_$1" "$2"; fi
		measure "$pass" "$1" "$2"
		if [ "$SESSIONS" -gt 0 ] && [ "$2" = 1 ] && { [ "$1" = lockd ] || [ "$1" = etcd ]; }; then
			stop_all # a fresh server: its memory is the sessions' only
			"start_$1" 1
			measure_sessions "$pass" "$1"
		fi
		stop_all
	done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report ----------------------------------------------------------------
# provisional warns when other work loaded the machine: the ratios of one
# pass still compare systems under the same load, the absolute numbers less.
provisional() {
	awk -v l="${LOAD_BEFORE%% *}" -v n="$(nproc)" 'BEGIN { if (l > n) printf "**Provisional:** the 1-minute load average (%s) was above the core count (%d) before the run: other work shared the cores, so absolute numbers are low and noisy; the ratios (systems measured one after another under the same load) are the part to read.\n", l, n }'
}
ver() { "$@" 2>&1 | head -1 || true; }
WRITING=1
{
	cat <<-EOF
		# Benchmark results

		Written by \`$CMDLINE\` (from the repository root) on $START.
		Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(uname -sr);
		load average $LOAD_BEFORE before the run and $LOAD_AFTER after it.
		$(provisional)

		Versions:
		- $("$LOCKD" version 2>&1 | head -1) ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)), $(go version | cut -d' ' -f3)
		- $(ver redis-server --version)
		- $(ver etcd --version)
		- ZooKeeper $(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null), $(ver java -version)
		- clients: $(grep -E 'go-redis|etcd/client/v3 |go-zookeeper' "$ROOT/bench/go.mod" | sed 's/^[[:space:]]*//' | tr '\n' ';' | sed 's/;$//; s/;/, /g')

		Settings: $CLIENTS workers, each its own client (own connections) and
		session, TTL $TTL; each measurement a $WARMUP warm-up then $DURATION
		measured; $PASSES passes, each starting every system fresh, one
		system at a time; clients and servers are separate processes on
		127.0.0.1 sharing the same cores. Workloads: (a) \`own\` — every
		worker takes and releases its own lock (acquire+release pairs/s);
		(b) \`one\` — every worker takes and releases one shared lock
		(grants/s, each a handoff when others wait; fairness = fewest
		grants of a worker / most); (c) \`handoff\` — the same, with the
		latency of each handoff, from the holder's release call to the grant
		of a worker already waiting. The same engine (internal/loadgen)
		drives every system: \`lockd bench\` for lockd, bench/cmd/compare for
		the others.

		Durability, as configured:
		- lockd: default \`lockd serve\`; a grant is acknowledged after the Raft log
		  entry is fsynced on a majority.
		- Redis: \`appendonly yes\`, \`appendfsync always\` (fsync before each reply),
		  no RDB snapshots; locks by the repo's redislock package (SET NX PX
		  with a fencing-token INCR in one Lua script, compare-and-delete
		  release, pub/sub wake-ups and retries for waiters).
		- etcd: defaults (WAL fsync per batch on a majority); client
		  concurrency.Session + concurrency.Mutex.
		- ZooKeeper: \`forceSync=yes\` (the default; fsync per batch on a
		  quorum), -Xmx256m; go-zookeeper's lock recipe.

		Workload (d), when run: \`--sessions\` sessions ($SESSIONS here; etcd: leases
		by concurrency.Session) at TTL $TTL created by the $CLIENTS clients on a
		fresh one-node server, then kept alive; the server's CPU is read from
		/proc over ${SESSIONS_DURATION} s after a ${SESSIONS_WARMUP} s creation warm-up, its memory
		is the peak resident set (VmHWM).

		Connections opened are counted by each client's dialer; "window" is
		the measured part, "all" includes setup and warm-up. Client CPU is the
		whole bench process (getrusage) per op.

	EOF
	"$COMPARE" results "$WORK/results"
} >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
WRITING=
log "wrote $OUT"
