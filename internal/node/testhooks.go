package node

import (
	wal "github.com/hashicorp/raft-wal"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/lease"
)

// This file exports what the whole-node tests (internal/server, which runs
// nodes over HTTP) check inside a node. Nothing else calls it.

// TestHooks reads a node's insides for the whole-node tests.
type TestHooks struct{ *Node }

// Hooks returns the node's test hooks.
func (s *Node) Hooks() TestHooks { return TestHooks{s} }

// Delays returns the lock-delay timers.
func (s TestHooks) Delays() *lease.Manager { return s.delays }

// WAL returns the Raft log store.
func (s TestHooks) WAL() *wal.WAL { return s.wal }

// AckCounts returns how many leadership checks waited for a fresh quorum
// (waits) and how many found none in time (stale) (acks.go).
func (s TestHooks) AckCounts() (waits, stale uint64) { return s.acks.waits.Load(), s.acks.stale.Load() }

// LogBytes returns the log bytes written since the node started, and a
// channel that receives when a snapshot by log size is taken (snapshots.go).
func (s TestHooks) LogBytes() (total uint64, taken <-chan struct{}) {
	return s.logSize.total.Load(), s.logSize.taken
}

// SnapshotMetrics returns the snapshot duration and size metrics.
func (m *LockMetrics) SnapshotMetrics() (prometheus.Histogram, prometheus.Gauge) {
	return m.snapshotSeconds, m.snapshotBytes
}

// VerifyChecks returns how many shared leadership checks have started.
func (s TestHooks) VerifyChecks() uint64 { return s.verify.Checks() }

// ReportApplyVersion makes the node report command version v (on /readyz
// and in Status) instead of the one it applies: an in-process stand-in for
// a node of another version (0: the real one).
func (s TestHooks) ReportApplyVersion(v uint32) { s.vers.reported.Store(v) }

// WatchdogTrips returns the counter of the leader watchdog's trips.
func (s TestHooks) WatchdogTrips() prometheus.Counter { return s.metrics.watchdogTrips }
