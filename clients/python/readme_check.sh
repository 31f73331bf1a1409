#!/bin/sh
# Installs the package into a fresh venv (Debian's python3-venv, system site
# packages for grpcio and protobuf, no PyPI) and runs the README's examples
# against a lockd serve started here. Usage: readme_check.sh LOCKD_BIN
set -eu
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
raft=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --data-dir "$tmp/data" --listen "127.0.0.1:$port" --raft-listen "127.0.0.1:$raft" >"$tmp/log" 2>&1 &
pid=$!
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$tmp/venv/bin/pip" install -q --no-build-isolation --no-index "$here"
i=0
until curl -fs "http://127.0.0.1:$port/readyz" >/dev/null; do
	i=$((i + 1)); [ $i -lt 300 ] || { cat "$tmp/log"; exit 1; }; sleep 0.1
done
# Each ```python block of the README, run from outside the source tree.
awk '/^```python$/{n++; f=sprintf("'"$tmp"'/example%d.py", n); next} /^```$/{f=""} f{print > f}' "$here/README.md"
cd "$tmp"
for f in example*.py; do
	echo "--- $f"
	LOCKD_ENDPOINTS="http://127.0.0.1:$port" "$tmp/venv/bin/python" "$f"
done
"$tmp/venv/bin/python" -c 'import lockd, sys; assert "/venv/" in lockd.__file__, lockd.__file__; print("installed:", lockd.__file__)'
