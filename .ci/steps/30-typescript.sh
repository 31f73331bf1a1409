#!/usr/bin/env bash
# TypeScript client (clients/typescript): its node --test suite against real
# lockd serve processes (session stream on and off, a frozen server's lease
# loss, the payment-webhook example across three processes), then npm pack
# installed into a clean folder with the README's example run against
# lockd serve. Needs Node.js >= 20 and npm (installed with apt when missing).
set -euo pipefail
export CI=true
major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$major" -lt 20 ] && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  major="$(node -p 'process.versions.node.split(".")[0]')"
fi
if [ "$major" -lt 20 ]; then
  echo "30-typescript: Node.js >= 20 needed, found ${major}" >&2
  exit 1
fi
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/lockd" ./cmd/lockd
export LOCKD_BIN="$bin/lockd"
cd clients/typescript
npm ci --no-audit --no-fund
# The committed generated code must be that of the .proto files.
npm run generate >/dev/null
git diff --exit-code --stat -- src/gen || { echo "30-typescript: src/gen differs from the .proto files: run npm run generate in clients/typescript and commit it" >&2; exit 1; }
npm test
bash scripts/pack-check.sh
# The conformance suite (conformance/) with the TypeScript driver: every
# case, the SIGSTOP, connection-cut and leader-kill ones included.
cd ../..
LOCKD_CONFORMANCE_ALL=1 LOCKD_CONFORMANCE_DRIVER="node $PWD/clients/typescript/driver.mjs" \
  go test -count=1 -timeout 10m -run 'TestConformance$' ./conformance
