# syntax=docker/dockerfile:1
# The lockd container image: the static lockd binary on an empty base (no
# shell, no package manager, no libc), run as an unprivileged user, its
# data on a volume. deploy/image builds the same image without a container
# engine (its test checks that both agree, line by line of the final stage
# below); docs/install.md shows how to run it.
#
#   docker build --build-arg VERSION=v1.2.0 --build-arg COMMIT=$(git rev-parse HEAD) -t lockd .

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=v0.0.0-dev
ARG COMMIT=unknown
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# The flags of scripts/release.sh: static, no build-time paths, stamped.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -buildid= -X main.version=$VERSION -X main.commit=$COMMIT" \
      -o /out/usr/local/bin/lockd ./cmd/lockd
# The files the empty base lacks: the user (uid 65532, "nonroot" as in
# distroless) and the data dir it owns.
RUN mkdir -p /out/etc /out/var/lib/lockd /out/tmp \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >/out/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' >/out/etc/group \
 && chmod 0700 /out/var/lib/lockd && chmod 1777 /out/tmp

FROM scratch
COPY --from=build /out/etc/passwd /out/etc/group /etc/
COPY --from=build /out/tmp /tmp
COPY --from=build /out/usr/local/bin/lockd /usr/local/bin/lockd
COPY --from=build --chown=65532:65532 /out/var/lib/lockd /var/lib/lockd
USER 65532:65532
WORKDIR /var/lib/lockd
# The data dir: Raft log, snapshots, node id. Keep it across restarts and
# upgrades; a node that loses it must rejoin under a new id.
VOLUME ["/var/lib/lockd"]
# 7070/tcp: the API (Connect, gRPC, JSON), /metrics, the dashboard (/ui/),
# and the probes: GET /healthz (the process serves) and GET /readyz (a
# member that knows a leader; 503 otherwise).
EXPOSE 7070/tcp
# 7071/tcp: Raft, between the members only.
EXPOSE 7071/tcp
# SIGTERM: a leader hands leadership to another voter, then the node
# exits; give it the default 10 s grace or more.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/lockd"]
# A node listening on the container's loopback only. To serve others, give
# the whole command: --listen 0.0.0.0:7070 --raft-listen 0.0.0.0:7071,
# --advertise and --raft-advertise with the name others reach it by, and
# TLS flags (or --insecure); docs/install.md.
CMD ["serve", "--data-dir", "/var/lib/lockd"]
