package node

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// This file takes snapshots by log size. hashicorp/raft snapshots by entry
// count, and only when its snapshot loop wakes (every SnapshotInterval to
// twice that): under load a node can write millions of entries between two
// checks, and a restart then replays all of them (1 000 000 entries took
// well over 10 s, longer than a default TTL). Counting the bytes written to
// the log since the last snapshot and asking for a snapshot at once when
// they pass SnapshotLogBytes bounds what a restart replays.

// logSize counts the bytes written to the Raft log and those written since
// the last snapshot began.
type logSize struct {
	limit  uint64        // SnapshotLogBytes; 0: off
	total  atomic.Uint64 // bytes of entry data written to the log
	atSnap atomic.Uint64 // total when the last snapshot began
	state  atomic.Uint64 // size of the last snapshot stored (snapshots_state.go)
	kick   chan struct{} // a snapshot is due (buffered: one pending at most)
	taken  chan struct{} // signalled after each snapshot by log size (tests)
}

func newLogSize(limit uint64) *logSize {
	return &logSize{limit: limit, kick: make(chan struct{}, 1), taken: make(chan struct{}, 1)}
}

// wrote counts a batch of n bytes and kicks the snapshotter when due.
func (l *logSize) wrote(n uint64) {
	t := l.total.Add(n)
	if l.limit > 0 && t-l.atSnap.Load() >= l.due() {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// snapshotStarted notes that a snapshot (by any trigger, or one installed
// from the leader) covers the log written so far.
func (l *logSize) snapshotStarted() { l.atSnap.Store(l.total.Load()) }

// snapshotByLogSize asks Raft for a snapshot whenever the log written since
// the last one passes SnapshotLogBytes.
func (s *Node) snapshotByLogSize(l *logSize) {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case <-l.kick:
		}
		if l.total.Load()-l.atSnap.Load() < l.due() {
			continue // a snapshot by another trigger came first
		}
		err := s.raftCall(func() error { return s.raft.Snapshot().Error() })
		switch {
		case err == nil:
			s.log.Info("snapshot taken by log size", "log_bytes", l.due())
			select {
			case l.taken <- struct{}{}:
			default:
			}
		case errors.Is(err, raft.ErrNothingNewToSnapshot):
			// The log bytes are not applied yet: the next batch kicks again.
		case errors.Is(err, raft.ErrRaftShutdown):
			return
		default:
			s.log.Warn("snapshot by log size", "err", err)
		}
	}
}

// sizedSnapshotStore tells logSize when a snapshot begins.
type sizedSnapshotStore struct {
	raft.SnapshotStore
	size *logSize
	m    *LockMetrics // snapshot duration and size
}

// Create notes the snapshot's start, then creates it.
func (s *sizedSnapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration, configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	s.size.snapshotStarted()
	start := time.Now()
	sink, err := s.SnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		return sink, err
	}
	sink = &sizeSink{SnapshotSink: sink, size: s.size}
	if s.m == nil {
		return sink, nil
	}
	return &timedSink{SnapshotSink: sink, m: s.m, start: start}, nil
}
