package node

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"
)

// TestReplayCacheReadsWhatTheLogHolds: on a real raft-wal log, a read
// through the node's log store (with its replay cache filled by a first
// pass, as NewRaft's) gives what a read of the log itself gives, whatever
// stores and deletes (a follower's truncated tail, a compacted head) come
// between; and the cache serves the second pass.
func TestReplayCacheReadsWhatTheLogHolds(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		w, err := wal.Open(t.TempDir(), wal.WithSegmentSize(64<<10))
		if err != nil {
			rt.Fatal(err)
		}
		defer w.Close()
		c := newCountingLogStore(w, prometheus.NewRegistry(), newLogSize(0))
		gen := 0
		entry := func(i uint64) *raft.Log {
			gen++
			return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry %d, version %d", i, gen)}
		}
		n := rapid.Uint64Range(1, 300).Draw(rt, "entries")
		for i := uint64(1); i <= n; i++ {
			if err := w.StoreLog(entry(i)); err != nil {
				rt.Fatal(err)
			}
		}
		check := func(i uint64) {
			var got, want raft.Log
			errGot, errWant := c.GetLog(i, &got), w.GetLog(i, &want)
			if (errGot == nil) != (errWant == nil) || errGot == nil && (got.Index != want.Index || !bytes.Equal(got.Data, want.Data)) {
				rt.Fatalf("entry %d: read %q (%v), the log holds %q (%v)", i, got.Data, errGot, want.Data, errWant)
			}
		}
		// The first pass, as NewRaft's: everything after a snapshot.
		from := rapid.Uint64Range(1, n).Draw(rt, "first pass from")
		c.replay.fill(true)
		for i := from; i <= n; i++ {
			check(i)
		}
		c.replay.fill(false)
		if rapid.Bool().Draw(rt, "second pass at once") {
			for i := from; i <= n; i++ {
				if !c.replay.take(i, new(raft.Log)) {
					rt.Fatalf("entry %d of the first pass not kept", i)
				}
			}
		}
		for range rapid.IntRange(0, 40).Draw(rt, "steps") {
			first, _ := w.FirstIndex()
			last, _ := w.LastIndex()
			switch rapid.IntRange(0, 3).Draw(rt, "step") {
			case 0: // append
				k := rapid.Uint64Range(1, 5).Draw(rt, "append")
				var ls []*raft.Log
				for i := last + 1; i <= last+k; i++ {
					ls = append(ls, entry(i))
				}
				if err := c.StoreLogs(ls); err != nil {
					rt.Fatal(err)
				}
			case 1: // a follower's conflicting tail, replaced
				if last <= first {
					continue
				}
				at := rapid.Uint64Range(first+1, last).Draw(rt, "truncate at")
				if err := c.DeleteRange(at, last); err != nil {
					rt.Fatal(err)
				}
				k := rapid.Uint64Range(0, 5).Draw(rt, "rewrite")
				var ls []*raft.Log
				for i := at; i < at+k; i++ {
					ls = append(ls, entry(i))
				}
				if len(ls) > 0 {
					if err := c.StoreLogs(ls); err != nil {
						rt.Fatal(err)
					}
				}
			case 2: // the head compacted after a snapshot
				if last <= first {
					continue
				}
				to := rapid.Uint64Range(first, last-1).Draw(rt, "compact to")
				if err := c.DeleteRange(first, to); err != nil {
					rt.Fatal(err)
				}
			case 3:
				if last >= first && last > 0 {
					check(rapid.Uint64Range(max(first, 1)-1, last+1).Draw(rt, "read"))
				}
			}
		}
		first, _ := w.FirstIndex()
		last, _ := w.LastIndex()
		for i := first; i <= last; i++ {
			check(i)
		}
	})
}

// TestReplayCacheServesTheSecondPass: the second read of each entry comes
// from memory, every entry before it goes with it, and the cache is empty
// after the pass; a store during it drops only the entries from its index
// on.
func TestReplayCacheServesTheSecondPass(t *testing.T) {
	var c replayCache
	c.fill(true)
	c.keep(&raft.Log{Index: 40, Data: []byte{40}}) // NewRaft reads the last entry first
	if c.first != 40 || len(c.logs) != 1 {
		t.Fatalf("kept from %d, %d entries; want 40 and 1", c.first, len(c.logs))
	}
	for i := uint64(10); i < 20; i++ {
		c.keep(&raft.Log{Index: i, Data: []byte{byte(i)}})
	}
	c.fill(false)
	if len(c.logs) != 10 || c.bytes != 10 {
		t.Fatalf("kept %d entries, %d bytes; want 10 and 10", len(c.logs), c.bytes)
	}
	var l raft.Log
	if !c.take(12, &l) || l.Index != 12 || l.Data[0] != 12 {
		t.Fatalf("take 12: %+v", l)
	}
	if c.take(11, &l) || c.first != 13 || c.bytes != 7 {
		t.Fatalf("entries before 12 still kept: first %d, %d bytes", c.first, c.bytes)
	}
	c.changing(17, 17) // a store from 17 on
	if len(c.logs) != 4 || c.take(17, &l) {
		t.Fatalf("after a store at 17: %d entries kept (want 13-16)", len(c.logs))
	}
	c.changing(1, 14) // a compaction up to 14
	if c.first != 15 || len(c.logs) != 2 || c.bytes != 2 {
		t.Fatalf("after compacting to 14: first %d, %d entries, %d bytes", c.first, len(c.logs), c.bytes)
	}
	for i := uint64(15); i <= 16; i++ {
		if !c.take(i, &l) || l.Index != i {
			t.Fatalf("take %d: %+v", i, l)
		}
	}
	if c.logs != nil || c.bytes != 0 {
		t.Fatalf("after the pass: %d entries, %d bytes kept", len(c.logs), c.bytes)
	}
	c.keep(&raft.Log{Index: 30}) // not filling
	if c.logs != nil {
		t.Fatal("kept an entry while not filling")
	}
}
