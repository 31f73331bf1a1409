#!/usr/bin/env bash
# The systemd unit: `systemd-analyze verify` on deploy/systemd/lockd.service
# must print nothing (an unknown key or bad value is only a warning there,
# so any output fails), checked to catch a misspelt key on a broken copy;
# and `systemd-analyze security` must rate it 2.0 or better. The unit's
# command line itself runs in TestInstallWalkthrough (cmd/lockd).
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
start=$SECONDS
if ! command -v systemd-analyze >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# verify wants the ExecStart binary to exist: a lockd built from this tree
# in place of /usr/local/bin/lockd, nothing else changed.
go build -o "$work/lockd" ./cmd/lockd
sed "s#^ExecStart=/usr/local/bin/lockd #ExecStart=$work/lockd #" deploy/systemd/lockd.service >"$work/lockd.service"
grep -q "^ExecStart=$work/lockd serve" "$work/lockd.service"
out="$(systemd-analyze verify "$work/lockd.service" 2>&1)" || { echo "$out" >&2; exit 1; }
if [ -n "$out" ]; then
  echo "systemd: verify warns:" >&2
  echo "$out" >&2
  exit 1
fi
# The check can fail: a misspelt key is reported.
sed 's/^NoNewPrivileges=/NoNewPrivilegez=/' "$work/lockd.service" >"$work/broken.service"
if [ -z "$(systemd-analyze verify "$work/broken.service" 2>&1)" ]; then
  echo "systemd: verify did not report a misspelt key; this check proves nothing here" >&2
  exit 1
fi
systemd-analyze security --offline=true --threshold=20 "$work/lockd.service" | tail -1
echo "systemd: unit verified, $((SECONDS - start))s"
