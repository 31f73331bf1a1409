package fsm_test

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	"google.golang.org/protobuf/proto"
)

// A session cannot hold or wait for more than MaxLocksPerSession locks: the
// next acquire is refused with CodeTooMany and changes nothing.
func TestTooManyLocksPerSession(t *testing.T) {
	f := fsm.New(nil)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	apply(t, f, &fsmv1.CreateSession{SessionId: "s", TtlMs: 10000})
	for i := range fsm.MaxLocksPerSession {
		apply(t, f, &fsmv1.Acquire{SessionId: "s", Seq: uint64(i + 1), Ack: uint64(i + 1), Name: fmt.Sprint("l", i), Mode: excl})
	}
	b, _ := fsm.Encode(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "s", Seq: fsm.MaxLocksPerSession + 1, Ack: fsm.MaxLocksPerSession + 1, Name: "one-more", Mode: excl})
	if r := f.ApplyCommand(b); r.Code != fsm.CodeTooMany {
		t.Fatalf("acquire past the limit: %+v, want CodeTooMany", r)
	}
	if _, ok := f.Describe("one-more"); ok {
		t.Fatal("refused acquire created the lock")
	}
}

// Completion marks outlive their holds and their sessions: a session's live
// marks count toward MaxLocksPerSession like its holds, so one session
// cannot pile up marks without bound.
func TestMarksCountTowardTheSessionCap(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s"))
	seq := uint64(0)
	for i := range fsm.MaxLocksPerSession {
		seq++
		g := mustOK(t, f, &fsmv1.Acquire{SessionId: "s", Seq: seq, Ack: seq, Name: fmt.Sprint("l", i), Mode: excl})
		seq++
		mustOK(t, f, &fsmv1.Complete{SessionId: "s", Seq: seq, Ack: seq, Name: fmt.Sprint("l", i), Token: g.Token, RetentionMs: 60000})
	}
	seq++
	if r := apply(t, f, &fsmv1.Acquire{SessionId: "s", Seq: seq, Ack: seq, Name: "one-more", Mode: excl}); r.Code != fsm.CodeTooMany {
		t.Fatalf("acquire with %d live marks: got %+v, want CodeTooMany", fsm.MaxLocksPerSession, r)
	}
	// A cleared mark frees its place.
	mustOK(t, f, &fsmv1.ClearMark{Name: "l0", Token: epoch + 1})
	seq++
	mustOK(t, f, &fsmv1.Acquire{SessionId: "s", Seq: seq, Ack: seq, Name: "one-more", Mode: excl})
}

// Marks and locks with a lock-delay are capped in total, across sessions:
// beyond the cap, Complete and the acquire that would create such a lock
// are refused with CodeTooMany and change nothing. (Caps shrunk for the
// test; the per-session cap above runs at the real constant.)
func TestMarksAndDelayLocksCappedInTotal(t *testing.T) {
	caps := fsm.CurrentCaps()
	caps.Marks, caps.DelayLocks = 2, 2
	fsm.SetCaps(t, caps)
	f := initFSM(t, nil)
	for i := range 3 {
		id := fmt.Sprint("s", i)
		mustOK(t, f, newSession(id))
		g := mustOK(t, f, acq(id, 1, fmt.Sprint("m", i), excl, false))
		x := &fsmv1.Complete{SessionId: id, Seq: 2, Name: fmt.Sprint("m", i), Token: g.Token, RetentionMs: 60000}
		if i < 2 {
			mustOK(t, f, x)
			continue
		}
		before := f.State()
		if r := apply(t, f, x); r.Code != fsm.CodeTooMany {
			t.Fatalf("third mark: got %+v, want CodeTooMany", r)
		}
		if after := f.State(); !proto.Equal(withoutResult(before, id, 2), withoutResult(after, id, 2)) {
			t.Fatal("refused Complete changed the lock table")
		}
	}
	for i := range 3 {
		a := &fsmv1.Acquire{SessionId: "s0", Seq: uint64(10 + i), Name: fmt.Sprint("d", i), Mode: excl, LockDelayMs: 1000}
		r := apply(t, f, a)
		if i < 2 && r.Code != fsm.OK || i == 2 && r.Code != fsm.CodeTooMany {
			t.Fatalf("lock-delay lock %d: got %+v", i, r)
		}
	}
	if _, ok := f.Describe("d2"); ok {
		t.Fatal("refused acquire created the lock")
	}
	// An existing lock-delay lock takes more holders; expiry delays it
	// (it cannot be refused) without exceeding the cap.
	mustOK(t, f, newSession("w"))
	mustOK(t, f, acq("w", 1, "d0", excl, true))
	mustOK(t, f, &fsmv1.ExpireSession{SessionId: "s0"})
	var delays int
	f.WithDelays(func(m map[string]fsm.Delay) { delays = len(m) })
	if delays != 2 {
		t.Fatalf("after expiry: %d delayed locks, want 2", delays)
	}
}
