#!/usr/bin/env bash
# The Python client (clients/python): its pytest suite and the
# monthly-invoices example against real lockd serve processes, the
# conformance suite with its driver, a check that
# the generated protobuf modules match proto/, and the package installed
# with pip into a fresh venv (Debian's packages, no PyPI) running its
# README's examples. Debian's /usr/bin/python3 only: the packages are
# Debian's.
set -euo pipefail
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-grpcio python3-protobuf python3-pytest \
    python3-pytest-asyncio python3-venv python3-setuptools python3-pip curl >/dev/null
fi
export CI=true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/lockd" ./cmd/lockd
# The committed _pb2 modules are what the generator writes from this tree.
go run clients/python/gen/main.go
git diff --exit-code -- clients/python/lockd/_pb
export LOCKD_BIN="$tmp/lockd"
(cd clients/python && /usr/bin/python3 -m pytest -q -p no:cacheprovider tests examples/invoices)
# Again with every call unary (the fallback when no session stream can be used).
(cd clients/python && LOCKD_STREAM=off /usr/bin/python3 -m pytest -q -p no:cacheprovider tests)
clients/python/readme_check.sh "$LOCKD_BIN"
# The conformance suite (conformance/, the Go side of the protocol) with the
# Python driver: every case, the SIGSTOP, connection-cut and leader-kill
# ones included.
LOCKD_CONFORMANCE_ALL=1 LOCKD_CONFORMANCE_DRIVER="/usr/bin/python3 $PWD/clients/python/driver.py" \
  go test -count=1 -timeout 10m -run 'TestConformance$' ./conformance
