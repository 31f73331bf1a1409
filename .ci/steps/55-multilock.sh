#!/usr/bin/env bash
# bench/multilock.sh end to end, short (10 s, 3 nodes, 8 worker processes,
# a watcher and the checker, each its own process), so the multi-lock soak
# in bench/RESULTS.md stays runnable and its checker keeps finding no
# partial set, no overlapping hold and no token out of order. No
# throughput is asserted (a busy machine).
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
start=$SECONDS
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if ! timeout 600 bench/multilock.sh --duration 10s >"$work/out" 2>"$work/err"; then
  cat "$work/out" "$work/err" >&2
  echo "multilock: the soak failed" >&2
  exit 1
fi
grep -q '^violations=0$' "$work/out" || { cat "$work/out" >&2; echo "multilock: no violations=0 line" >&2; exit 1; }
grep -Eq 'sets granted [1-9][0-9]*' "$work/out" || { cat "$work/out" >&2; echo "multilock: no set granted" >&2; exit 1; }
echo "multilock: ok in $((SECONDS - start)) s: $(grep -m1 'sets granted' "$work/out")"
