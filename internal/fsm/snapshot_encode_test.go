package fsm_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// checkEncoding fails unless b, a Raft snapshot of f, is byte for byte
// EncodeSnapshot(f.State()) with the applied index b carries: the Raft
// snapshot is encoded lock by lock without building State's messages, and
// must stay the very bytes a whole-message encoding gives (so every field
// State records reaches the snapshot, in the same order). The property
// test calls it after every command.
func checkEncoding(tb fataler, f *fsm.FSM, b []byte) {
	tb.Helper()
	if len(b) == 0 {
		tb.Fatalf("empty snapshot")
	}
	var got fsmv1.Snapshot
	if err := proto.Unmarshal(b[1:], &got); err != nil {
		tb.Fatalf("decode snapshot: %v", err)
	}
	want := f.State()
	want.AppliedIndex = got.AppliedIndex
	wb, err := fsm.EncodeSnapshot(want)
	if err != nil {
		tb.Fatalf("encode: %v", err)
	}
	if !bytes.Equal(b, wb) {
		tb.Fatalf("snapshot encoding (%d bytes) differs from EncodeSnapshot(State()) (%d bytes):\n got %v\nwant %v", len(b), len(wb), &got, want)
	}
}

// TestEncodeLocked: the scripted state (shared holders with values,
// queues, a mark, duplicate answers, members) encodes to the bytes of
// EncodeSnapshot(State()), twice in a row (the buffer hint and the reused
// messages carry nothing from one snapshot to the next), and after a
// restore of itself.
func TestEncodeLocked(t *testing.T) {
	f := scripted(t)
	mustOK(t, f, newSession("s9"))
	r := mustOK(t, f, acq("s9", 1, "done", excl, false))
	mustOK(t, f, &fsmv1.Complete{SessionId: "s9", Seq: 2, Name: "done", Token: r.Token, RetentionMs: 60000})
	b := persist(t, f)
	checkEncoding(t, f, b)
	checkEncoding(t, f, persist(t, f))
	g := fsm.New(nil)
	if err := g.RestoreBytes(b); err != nil {
		t.Fatal(err)
	}
	checkEncoding(t, g, persist(t, g))
	st := f.State()
	var queued, marked bool
	for _, l := range st.Locks {
		queued = queued || len(l.Queue) > 0
		marked = marked || l.Mark != nil
	}
	if !queued || !marked || len(st.Members) == 0 {
		t.Fatalf("the scripted state lacks a queue (%v), a mark (%v) or members (%d): the test covers less than it says", queued, marked, len(st.Members))
	}
}
