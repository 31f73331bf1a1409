#!/usr/bin/env bash
# Release build: lockd for linux and darwin on amd64 and arm64, static
# (CGO_ENABLED=0), stamped with the version and commit, reproducible, one
# tarball per target plus SHA256SUMS.
#
#   scripts/release.sh                      # all four targets into dist/
#   VERSION=v1.2.0 scripts/release.sh       # a tagged release
#   TARGETS="linux/arm64" OUT=/tmp/d scripts/release.sh
#
# Knobs (environment):
#   VERSION  the version `lockd version` prints (default: git describe
#            --tags --always --dirty, else v0.0.0-dev)
#   COMMIT   the commit it prints (default: git rev-parse HEAD, else unknown)
#   TARGETS  space-separated GOOS/GOARCH pairs (default: the four above)
#   OUT      output directory; earlier tarballs and SHA256SUMS in it are
#            replaced (default: dist)
#   SOURCE_DATE_EPOCH  the time stamped on every tarball entry (default:
#            the commit's time, else 0), so tarballs are reproducible too
#
# Reproducible: the same tree, VERSION and COMMIT give byte-identical
# binaries and tarballs from any checkout path and machine with the same Go
# version. -trimpath drops build-time paths, -buildvcs=false drops the VCS
# stamp (its dirty flag and time vary; the commit comes in with -ldflags
# instead), -buildid= drops the build ID, and the tarballs are written with
# sorted names, fixed owners and times, and gzip -n (no name or time).
# .ci/steps/10-release.sh checks it by building twice from two paths.
# Needs GNU tar (gtar on macOS) and sha256sum or shasum.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

git_ok() { git -C "$root" rev-parse --git-dir >/dev/null 2>&1; }
if [ -z "${VERSION:-}" ]; then
  VERSION="$(git_ok && git describe --tags --always --dirty 2>/dev/null || true)"
  VERSION="${VERSION:-v0.0.0-dev}"
fi
if [ -z "${COMMIT:-}" ]; then
  COMMIT="$(git_ok && git rev-parse HEAD 2>/dev/null || echo unknown)"
fi
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git_ok && git log -1 --format=%ct 2>/dev/null || echo 0)"
fi
TARGETS="${TARGETS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}"
OUT="${OUT:-dist}"
case "$VERSION$COMMIT" in
  *[!A-Za-z0-9._+-]*) echo "release: VERSION and COMMIT may hold only [A-Za-z0-9._+-]" >&2; exit 64 ;;
esac

tar=tar
command -v gtar >/dev/null 2>&1 && tar=gtar
if ! "$tar" --version 2>/dev/null | grep -q 'GNU tar'; then
  echo "release: needs GNU tar (gtar on macOS) for reproducible tarballs" >&2
  exit 69
fi
if command -v sha256sum >/dev/null 2>&1; then sha=(sha256sum); else sha=(shasum -a 256); fi

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
# Only this script's own output is removed from OUT, never the directory.
rm -rf "$OUT"/lockd_*_*_* "$OUT/SHA256SUMS"
# GOFLAGS is cleared below so that a local setting (-race, -cover, a
# -buildvcs) cannot change the bytes.
ldflags="-s -w -buildid= -X main.version=$VERSION -X main.commit=$COMMIT"
for target in $TARGETS; do
  goos="${target%/*}" goarch="${target#*/}"
  name="lockd_${VERSION}_${goos}_${goarch}"
  stage="$OUT/$name"
  mkdir -p "$stage/systemd"
  echo "release: $target" >&2
  CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" GOFLAGS= \
    go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$stage/lockd" ./cmd/lockd
  cp README.md "$stage/"
  cp docs/install.md "$stage/INSTALL.md"
  cp deploy/systemd/lockd.service deploy/systemd/lockd.env "$stage/systemd/"
  chmod 0755 "$stage/lockd"
  chmod 0644 "$stage/README.md" "$stage/INSTALL.md" "$stage/systemd/"*
  (cd "$OUT" && "$tar" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime="@$SOURCE_DATE_EPOCH" --mode=u+rwX,go+rX,go-w --format=ustar -cf - "$name" | gzip -9 -n >"$name.tar.gz")
  rm -rf "$stage"
done
(cd "$OUT" && "${sha[@]}" lockd_*.tar.gz >SHA256SUMS)
cat "$OUT/SHA256SUMS"
