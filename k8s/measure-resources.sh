#!/usr/bin/env bash
# measure-resources.sh: the numbers behind the Helm chart's resource
# requests. Starts a 3-node lockd cluster on 127.0.0.1 (a lockd built from
# this tree), runs `lockd bench` against it, and prints each node's peak
# RSS (VmHWM) and the CPU it used (utime+stime over the run, in cores).
#
#   k8s/measure-resources.sh                 # own-lock workload, 16 clients, 20 s
#   WORKLOAD=sessions SESSIONS=10000 k8s/measure-resources.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$out"' EXIT
go build -o "$out/lockd" ./cmd/lockd
base=$((20000 + RANDOM % 20000))
pids=()
for i in 0 1 2; do
  join=()
  [ "$i" = 0 ] || join=(--join "http://127.0.0.1:$base")
  "$out/lockd" serve --node-id "lockd-$i" --data-dir "$out/d$i" --listen "127.0.0.1:$((base + i))" \
    --raft-listen "127.0.0.1:$((base + 100 + i))" "${join[@]}" --log-level warn 2>"$out/log$i" &
  pids+=("$!")
  until curl -sf "http://127.0.0.1:$((base + i))/readyz" >/dev/null; do sleep 0.2; done
done
eps="127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))"
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A before
for p in "${pids[@]}"; do before[$p]=$(cpu "$p"); done
start=$(date +%s.%N)
workload="${WORKLOAD:-own}"
"$out/lockd" bench --endpoints "$eps" --workload "$workload" --clients "${CLIENTS:-16}" \
  --sessions "${SESSIONS:-1000}" --warmup 2s --duration "${DURATION:-20s}"
end=$(date +%s.%N)
hz=$(getconf CLK_TCK)
echo "workload=$workload clients=${CLIENTS:-16} sessions=${SESSIONS:-1000} duration=${DURATION:-20s} (wall $(echo "$end - $start" | bc) s)"
for i in 0 1 2; do
  p=${pids[$i]}
  rss=$(awk '/VmHWM/ {print $2}' "/proc/$p/status")
  used=$(( $(cpu "$p") - ${before[$p]} ))
  echo "lockd-$i peak_rss_mib=$((rss / 1024)) cpu_cores=$(echo "scale=2; $used / $hz / ($end - $start)" | bc)"
done
