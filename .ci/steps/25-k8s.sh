#!/usr/bin/env bash
# The Kubernetes pieces, in their own Go module k8s/ (client-go and Helm
# stay out of lockd's go.mod): go vet, then the tests with -race:
#  - k8s/chart: the Helm chart deploy/helm/lockd rendered offline with the
#    Helm Go library for every values combination docs/kubernetes.md shows,
#    every object decoded strictly into the Kubernetes API types, the
#    invariants (ports match the flags, probes on paths lockd serves, PDB
#    keeps a majority, odd replicas); the chart's start script run for real
#    with lockd processes named lockd-0..2 (bootstrap, join, restart, lost
#    disk).
#  - k8s/lockdelection: the client-go leader-election lock backed by lockd:
#    ten kill -9 of the leading candidate process against a real 3-node
#    lockd (failover printed, p50 under 2 s; no two leaders by lockd's
#    history), beside client-go's Lease defaults on a fake clientset.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
cd k8s
go vet ./...
# -race where the concurrency is (the Lock, the elector); the chart tests
# render in one goroutine and drive processes, and compiling Helm with the
# race detector alone would cost minutes.
# -v for the failover numbers each run prints (the whole log on failure).
out="$(mktemp)"
if ! go test -race -count=1 -timeout 6m -v ./lockdelection >"$out" 2>&1; then
  cat "$out"
  exit 1
fi
grep -E 'failover after|LeaseLock defaults|^ok' "$out"
rm -f "$out"
go test -count=1 -timeout 6m ./chart
