#!/usr/bin/env bash
# Client CPU per acquire+release pair on workload (a) `own` (16 workers,
# each its own client and session), lockd's Go client against go-redis,
# every client a separate process from its server. One lockd server
# binary serves every lockd run, so only the client differs between the
# lockd binaries compared; Redis runs with AOF `appendfsync always`.
# Rounds alternate the order of the clients (A B redis, then redis B A, ...)
# so that drift in the machine's load falls on all of them. Each run starts
# its server fresh on free 127.0.0.1 ports and stops it (by pid) after.
# Prints one line per run (pairs/s, client CPU µs per pair from the bench
# process's getrusage over the measured window, server CPU µs per pair
# from /proc over warm-up and window) and the medians per client.
#
#   bench/clientcpu.sh                        # this tree's client, 3 rounds of 10 s
#   bench/clientcpu.sh --base 524aff0         # also an older commit's client
#   ROUNDS=5 DURATION=20s bench/clientcpu.sh --base HEAD~3
#   SERVER=new bench/clientcpu.sh --base 4ca00fb  # both clients against this tree's server
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
base=""
[ "${1:-}" = --base ] && base="${2:?--base COMMIT}"
rounds="${ROUNDS:-3}"
duration="${DURATION:-10s}"
work="$(mktemp -d)"
pid=""
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	[ -n "$base" ] && git worktree remove --force "$work/base-src" >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
command -v redis-server >/dev/null || { echo "clientcpu.sh: redis-server not installed (apt-get install redis-server)" >&2; exit 1; }

go build -o "$work/new" ./cmd/lockd
(cd bench && go build -o "$work/compare" ./cmd/compare)
clients="new"
if [ -n "$base" ]; then
	git worktree add --detach -q "$work/base-src" "$base"
	(cd "$work/base-src" && go build -o "$work/old" ./cmd/lockd)
	clients="old new"
fi
clients="$clients redis"
# The server of every lockd run: the base's when given, so that only the
# client changes; SERVER=new serves them all with this tree's (a client
# change that needs a new server: the stream's upgrade).
server="$work/new"
[ -n "$base" ] && [ "${SERVER:-base}" = base ] && server="$work/old"

port() { "$work/compare" ports 1; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

# run CLIENT: one fresh server, one bench; prints the result line.
run() {
	local c="$1" p d out="$work/out.json" t0 t1
	d="$work/data-$RANDOM"; mkdir -p "$d"
	p="$(port)"
	if [ "$c" = redis ]; then
		redis-server --port "$p" --bind 127.0.0.1 --dir "$d" --save '' --appendonly yes \
			--appendfsync always --protected-mode no --daemonize no >"$d.log" 2>&1 &
		pid=$!
		timeout 70 "$work/compare" wait --system redis --endpoints "127.0.0.1:$p"
		t0="$(ticks "$pid")"
		"$work/compare" run --system redis --endpoints "127.0.0.1:$p" --workload own --clients 16 \
			--warmup 2s --duration "$duration" --json >"$out"
	else
		"$server" serve --data-dir "$d" --listen "127.0.0.1:$p" --raft-listen "127.0.0.1:$(port)" --log-level warn 2>"$d.log" &
		pid=$!
		for _ in $(seq 300); do curl -sf "http://127.0.0.1:$p/readyz" >/dev/null && break; sleep 0.05; done
		t0="$(ticks "$pid")"
		"$work/$c" bench --endpoints "127.0.0.1:$p" --workload own --clients 16 \
			--warmup 2s --duration "$duration" --json >"$out"
	fi
	t1="$(ticks "$pid")"
	kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
	rm -rf "$d"
	/usr/bin/python3 - "$out" "$((t1 - t0))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ticks, hz = int(sys.argv[2]), int(sys.argv[3])
ops = r["ops"]
print(json.dumps({"pairs_s": round(r["ops_per_second"]), "client_us_pair": round(r.get("client_cpu_us_per_op", 0), 1),
	"server_us_pair": round(ticks / hz * 1e6 / ops, 1) if ops else 0, "errors": sum((r.get("errors") or {}).values())}))
PY
}

for c in $clients; do : >"$work/res-$c"; done
for i in $(seq "$rounds"); do
	order="$clients"
	[ $((i % 2)) -eq 0 ] && order="$(echo "$clients" | tr ' ' '\n' | tac | tr '\n' ' ')"
	for c in $order; do
		line="$(run "$c")"
		echo "round $i $c: $line"
		echo "$line" >>"$work/res-$c"
	done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for c in $clients; do
	/usr/bin/python3 - "$work/res-$c" "$c" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda k: statistics.median([r[k] for r in rows])
rng = lambda k: "%s–%s" % (min(r[k] for r in rows), max(r[k] for r in rows))
print("%-5s median of %d: %6.0f pairs/s, client CPU %5.1f µs/pair (%s), server CPU %5.1f µs/pair" % (
	sys.argv[2], len(rows), med("pairs_s"), med("client_us_pair"), rng("client_us_pair"), med("server_us_pair")))
PY
done
