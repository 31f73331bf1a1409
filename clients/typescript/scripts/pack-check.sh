#!/usr/bin/env bash
# npm pack, install the tarball into a clean folder, and run the README's
# Quick start example there against a real `lockd serve` (LOCKD_BIN).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
: "${LOCKD_BIN:?set LOCKD_BIN to a lockd binary}"
work="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
(cd "$here" && npm pack --silent --pack-destination "$work" >/dev/null)
mkdir "$work/app"
cd "$work/app"
npm init -y >/dev/null
npm install --no-audit --no-fund --silent "$work"/lockd-client-*.tgz
# The first ```js block of the README's Quick start.
awk '/^## Quick start/{q=1} q&&/^```js/{f=1;next} f&&/^```/{exit} f' "$here/README.md" > example.mjs
port="$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
raft="$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
"$LOCKD_BIN" serve --data-dir "$work/data" --listen "127.0.0.1:$port" --raft-listen "127.0.0.1:$raft" 2>"$work/serve.log" &
pid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
out="$(LOCKD_ENDPOINTS="http://127.0.0.1:$port" timeout 60 node example.mjs)"
echo "$out"
grep -q "token valid: true" <<<"$out"
echo "pack-check: ok"
