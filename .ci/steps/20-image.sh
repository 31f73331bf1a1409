#!/usr/bin/env bash
# Container image without a container engine: release binaries for
# linux/amd64 and linux/arm64 into deploy/image's OCI archive (the
# Dockerfile's image), built twice and compared byte for byte; then
# deploy/image's tests: TestImage unpacks an archive and checks the
# entrypoint, the non-root user, the ports, the volume, the stop signal, no
# shell or other program in the layer, runs the binary from the layer
# (lockd version; the image's command with /healthz and /readyz answering
# 200, then the stop signal and a clean exit within 10 s);
# TestDockerfileMatchesImage holds the Dockerfile to the same settings.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
start=$SECONDS
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export VERSION=v0.0.0-ci
export COMMIT="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
export SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"

TARGETS="linux/amd64 linux/arm64" OUT="$work/dist" scripts/release.sh >/dev/null
bins=()
for arch in amd64 arm64; do
  mkdir -p "$work/$arch"
  tar -xzf "$work/dist/lockd_${VERSION}_linux_${arch}.tar.gz" -C "$work/$arch" --strip-components=1
  bins+=(-bin "linux/$arch=$work/$arch/lockd")
done
(cd deploy/image && go vet ./... && go build -o "$work/image" .)
for out in a b; do
  "$work/image" "${bins[@]}" -version "$VERSION" -commit "$COMMIT" -created "$SOURCE_DATE_EPOCH" -out "$work/$out.tar"
done
if ! cmp "$work/a.tar" "$work/b.tar"; then
  echo "image: two builds from the same binaries differ: not reproducible" >&2
  exit 1
fi
echo "image: $(du -h "$work/a.tar" | cut -f1) archive (linux/amd64 + linux/arm64), sha256 $(sha256sum "$work/a.tar" | cut -c1-16)…, reproducible"
(cd deploy/image && go test -race -count=1 ./...)
echo "image: $((SECONDS - start))s"
