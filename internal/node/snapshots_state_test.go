package node

import (
	"io"
	"testing"

	"github.com/hashicorp/raft"
)

// TestSnapshotDueGrowsWithState: on a real file snapshot store, a stored
// snapshot's size raises the log bytes that make the next one due to an
// eighth of it (never below the configured bytes); a node opening the same
// store starts from the newest snapshot's size.
func TestSnapshotDueGrowsWithState(t *testing.T) {
	dir := t.TempDir()
	store, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	l := newLogSize(1000)
	if got := l.due(); got != 1000 {
		t.Fatalf("due with no snapshot: %d, want the limit 1000", got)
	}
	sized := &sizedSnapshotStore{SnapshotStore: store, size: l}
	take := func(index uint64, size int) {
		t.Helper()
		sink, err := sized.Create(raft.SnapshotVersionMax, index, 1, raft.Configuration{}, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sink.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
	}
	take(10, 4000) // an eighth is 500, below the limit
	if got := l.due(); got != 1000 {
		t.Fatalf("due after a 4000-byte snapshot: %d, want the limit 1000", got)
	}
	take(20, 80_000)
	if got := l.due(); got != 10_000 {
		t.Fatalf("due after an 80000-byte snapshot: %d, want 10000", got)
	}
	l.wrote(9999)
	select {
	case <-l.kick:
		t.Fatal("snapshot due after 9999 of 10000 bytes")
	default:
	}
	l.wrote(1)
	select {
	case <-l.kick:
	default:
		t.Fatal("no snapshot due after 10000 bytes")
	}
	reopened := newLogSize(1000)
	reopened.seedState(store)
	if got := reopened.due(); got != 10_000 {
		t.Fatalf("due after reopening the store: %d, want 10000", got)
	}
	off := newLogSize(0)
	off.seedState(store)
	off.wrote(1 << 20)
	select {
	case <-off.kick:
		t.Fatal("a snapshot by log size with the limit 0 (off)")
	default:
	}
}
