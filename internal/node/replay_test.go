package node

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"math"

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
		gen, top := 0, uint64(0) // top: the highest index ever written
		entry := func(i uint64) *raft.Log {
			gen, top = gen+1, max(top, i)
			return &raft.Log{Index: i, Term: uint64(gen), Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry %d, version %d", i, gen)}
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
			if (errGot == nil) != (errWant == nil) || errGot == nil && (got.Index != want.Index || got.Term != want.Term || !bytes.Equal(got.Data, want.Data)) {
				rt.Fatalf("entry %d: read %q (%v), the log holds %q (%v)", i, got.Data, errGot, want.Data, errWant)
			}
		}
		step := func() {
			first, _ := w.FirstIndex()
			last, _ := w.LastIndex()
			switch rapid.IntRange(0, 4).Draw(rt, "step") {
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
					return
				}
				at := rapid.Uint64Range(first+1, last).Draw(rt, "truncate at")
				if err := c.DeleteRange(at, last+rapid.Uint64Range(0, 2).Draw(rt, "past the end")); err != nil {
					return // (refused: the log is as it was)
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
					return
				}
				to := rapid.Uint64Range(first, last-1).Draw(rt, "compact to")
				if err := c.DeleteRange(first, to); err != nil {
					rt.Fatal(err)
				}
			case 3: // a snapshot installed: the whole log goes, the next entry comes later
				if last == 0 {
					return
				}
				if err := c.DeleteRange(first, last); err != nil {
					rt.Fatal(err)
				}
				if err := c.StoreLogs([]*raft.Log{entry(last + rapid.Uint64Range(1, 20).Draw(rt, "jump"))}); err != nil {
					rt.Fatal(err)
				}
			case 4:
				check(rapid.Uint64Range(1, top+1).Draw(rt, "read"))
			}
		}
		// The first pass, as NewRaft's: the last entry, then everything
		// after a snapshot; Raft's goroutines may change the log before
		// it ends.
		from := rapid.Uint64Range(1, n).Draw(rt, "first pass from")
		c.replay.fill(true)
		check(n)
		for i := from; i <= n; i++ {
			check(i)
		}
		steps := func(label string) int {
			k := rapid.IntRange(0, 40).Draw(rt, label)
			for range k {
				step()
			}
			return k
		}
		changed := steps("steps while filling") > 0
		c.replay.fill(false)
		if rapid.Bool().Draw(rt, "second pass at once") {
			for i := from; i <= n; i++ {
				if !changed && !c.replay.take(i, new(raft.Log)) {
					rt.Fatalf("entry %d of the first pass not kept", i)
				}
				check(i)
			}
		}
		steps("steps")
		// Every index ever written, deleted ones too.
		last, _ := w.LastIndex()
		for i := uint64(1); i <= max(last, top)+1; i++ {
			check(i)
		}
	})
}

// TestReplayCacheServesTheSecondPass: the apply's read of each entry (in
// order) comes from memory and drops it; another read of a kept entry is
// served and keeps it; a store drops only the entries from its index on, a
// compaction those up to its end; release drops the rest.
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
	one := 1 + replayEntryCost
	if len(c.logs) != 10 || c.bytes != 10*one {
		t.Fatalf("kept %d entries, %d bytes; want 10 and %d", len(c.logs), c.bytes, 10*one)
	}
	var l raft.Log
	if !c.take(12, &l) || l.Index != 12 || l.Data[0] != 12 || c.first != 10 || len(c.logs) != 10 {
		t.Fatalf("take 12 (not the apply's): %+v; kept from %d, %d entries", l, c.first, len(c.logs))
	}
	for i := uint64(10); i <= 12; i++ {
		if !c.take(i, &l) || l.Index != i {
			t.Fatalf("take %d: %+v", i, l)
		}
	}
	if c.take(11, &l) || c.first != 13 || c.bytes != 7*one {
		t.Fatalf("entries the apply read still kept: first %d, %d bytes", c.first, c.bytes)
	}
	c.changing(17, math.MaxUint64) // a store from 17 on
	if len(c.logs) != 4 || c.take(17, &l) {
		t.Fatalf("after a store at 17: %d entries kept (want 13-16)", len(c.logs))
	}
	c.changing(1, 14) // a compaction up to 14
	if c.first != 15 || len(c.logs) != 2 || c.bytes != 2*one {
		t.Fatalf("after compacting to 14: first %d, %d entries, %d bytes", c.first, len(c.logs), c.bytes)
	}
	if !c.take(15, &l) || l.Index != 15 {
		t.Fatalf("take 15: %+v", l)
	}
	c.release()
	if c.logs != nil || c.bytes != 0 || c.take(16, &l) {
		t.Fatalf("after release: %d entries, %d bytes kept", len(c.logs), c.bytes)
	}
	c.keep(&raft.Log{Index: 30}) // not filling
	if c.logs != nil {
		t.Fatal("kept an entry while not filling")
	}
	c.fill(true)
	c.changing(100, 100) // a change while filling ends the filling
	c.keep(&raft.Log{Index: 30})
	if c.logs != nil {
		t.Fatal("kept an entry after a change ended the filling")
	}
}

// TestReplayCacheUnderConcurrentChanges: reads fill the cache while
// another goroutine deletes and rewrites the log's tail, as Raft's
// goroutines may while NewRaft still fills it; afterwards every read
// through the store gives what the log holds.
func TestReplayCacheUnderConcurrentChanges(t *testing.T) {
	w, err := wal.Open(t.TempDir(), wal.WithSegmentSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := newCountingLogStore(w, prometheus.NewRegistry(), newLogSize(0))
	const n = 400
	version := func(i uint64, v int) *raft.Log {
		return &raft.Log{Index: i, Term: uint64(v), Data: fmt.Appendf(nil, "entry %d, version %d", i, v)}
	}
	for i := uint64(1); i <= n; i++ {
		if err := w.StoreLog(version(i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	c.replay.fill(true)
	done := make(chan error, 1)
	go func() {
		for v := 2; v < 40; v++ {
			at := uint64(n - 50 + v)
			if err := c.DeleteRange(at, n); err != nil {
				done <- err
				return
			}
			var ls []*raft.Log
			for i := at; i <= n; i++ {
				ls = append(ls, version(i, v))
			}
			if err := c.StoreLogs(ls); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 20 {
		var l raft.Log
		for i := uint64(1); i <= n; i++ {
			// (Between a delete and its store the entry is missing.)
			if err := c.GetLog(i, &l); err != nil && !errors.Is(err, raft.ErrLogNotFound) {
				t.Fatal(err)
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.replay.fill(false)
	for i := uint64(1); i <= n; i++ {
		var got, want raft.Log
		if err := c.GetLog(i, &got); err != nil {
			t.Fatal(err)
		}
		if err := w.GetLog(i, &want); err != nil {
			t.Fatal(err)
		}
		if got.Term != want.Term || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("entry %d: read %q, the log holds %q", i, got.Data, want.Data)
		}
	}
}
