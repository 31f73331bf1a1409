#!/usr/bin/env bash
# bench/memory.sh end to end at a small size (20 000 locks: 20 sessions ×
# 1000, a `lockd serve` and a bench/cmd/memfill process), so the memory
# measurement in bench/RESULTS.md stays runnable: it must build the table,
# print the peak, steady and restart lines with numbers, and heap profiles
# that go tool pprof reads. No figure is asserted (a busy machine).
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
start=$SECONDS
if ! command -v curl >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
timeout 600 bench/memory.sh --sessions 20 --locks 1000 --steady 2 --profiles "$work/p" >"$work/out" 2>"$work/err" || {
  cat "$work/out" "$work/err" >&2
  exit 1
}
fail() { echo "memory: $*" >&2; cat "$work/out" >&2; exit 1; }
grep -Eq '^locks: 20000 \(20 sessions × 1000\), built in [0-9.]+ s' "$work/out" || fail "no locks line"
grep -Eq '^build: peak RSS [1-9][0-9]* MiB \(VmHWM\), RSS when built [0-9]+ MiB, after 2 s [0-9]+ MiB' "$work/out" || fail "no build line"
grep -Eq '^restart: ready in [0-9.]+ s \(server CPU [0-9.]+ s\), RSS then [1-9][0-9]* MiB' "$work/out" || fail "no restart line"
grep -Eq '^  restore ([0-9.]+ s|-), config scan ([0-9.]+ s|-), election wait [0-9.]+ s, leader until established [0-9.]+ s$' "$work/out" || fail "no restart phases line"
for p in built steady restart; do
  go tool pprof -top "$work/p/$p.pb.gz" >/dev/null 2>&1 || fail "heap profile $p unreadable"
done
echo "memory: ok in $((SECONDS - start)) s"
