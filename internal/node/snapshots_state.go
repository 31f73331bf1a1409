package node

import "github.com/hashicorp/raft"

// Snapshots by log size, in proportion to the state. A snapshot writes the
// whole state, so taking one every SnapshotLogBytes (2 MiB) of log costs
// in proportion to the state per 2 MiB: with 1 000 000 locks (a snapshot
// of about 90 MB) that was a snapshot every 14 000 acquires, two thirds of
// all the node's allocation and most of its memory peak. The log written
// since the last snapshot must now also reach 1/snapshotStateRatio of that
// snapshot's size, so the snapshot work per byte of log stays bounded
// whatever the state's size, and a restart replays at most that much log
// beside the snapshot it loads: about an eighth more than loading the
// snapshot itself (a small state keeps the SnapshotLogBytes bound).

// snapshotStateRatio: a snapshot is due when the log since the last one
// passes 1/snapshotStateRatio of the last one's size (and SnapshotLogBytes).
const snapshotStateRatio = 8

// due is how many log bytes since the last snapshot make a new one due.
func (l *logSize) due() uint64 {
	return max(l.limit, l.state.Load()/snapshotStateRatio)
}

// seedState notes the size of the newest snapshot on disk at start, so the
// first snapshot after a restart is already in proportion to the state.
func (l *logSize) seedState(store raft.SnapshotStore) {
	if metas, err := store.List(); err == nil && len(metas) > 0 {
		l.state.Store(uint64(max(metas[0].Size, 0)))
	}
}

// sizeSink notes the snapshot's size in logSize once it is stored.
type sizeSink struct {
	raft.SnapshotSink
	size *logSize
	n    uint64
}

// Write counts the bytes written.
func (s *sizeSink) Write(p []byte) (int, error) {
	n, err := s.SnapshotSink.Write(p)
	s.n += uint64(max(n, 0))
	return n, err
}

// Close stores the snapshot, then notes its size.
func (s *sizeSink) Close() error {
	err := s.SnapshotSink.Close()
	if err == nil {
		s.size.state.Store(s.n)
	}
	return err
}
