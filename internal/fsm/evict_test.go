package fsm_test

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// A session waits on "a" (seq 1, still in flight so the client's ack stays 1)
// while it does 256 more requests on other locks. The duplicate table evicts
// seq 1 and raises ack, so the client's re-poll of its live wait is refused
// as invalid, although the wait is still queued and will be granted.
func TestLiveWaitOutlivesDuplicateTable(t *testing.T) {
	f := fsm.New(nil)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	apply(t, f, &fsmv1.CreateSession{SessionId: "h", TtlMs: 10000})
	apply(t, f, &fsmv1.CreateSession{SessionId: "w", TtlMs: 10000})
	r := apply(t, f, &fsmv1.Acquire{SessionId: "h", Seq: 1, Ack: 1, Name: "a", Mode: excl})
	tok := r.Token
	r = apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	if r.Status != fsm.StatusQueued {
		t.Fatalf("want queued, got %+v", r)
	}
	for i := uint64(2); i <= 258; i++ {
		// Other requests, each answered, while ack stays 1 (seq 1 in flight).
		apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: i, Ack: 1, Name: "x", Mode: shrd, Limit: nil})
	}
	r = apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	t.Logf("re-poll of live wait: code=%d msg=%q status=%d", r.Code, r.Msg, r.Status)
	st, _, pos := f.WaitState("w", "a", 1)
	t.Logf("server still has wait: status=%d pos=%d", st, pos)
	apply(t, f, &fsmv1.Release{SessionId: "h", Seq: 2, Ack: 2, Name: "a", Token: tok})
	st, tk, _ := f.WaitState("w", "a", 1)
	if r.Code != fsm.OK || r.Status != fsm.StatusQueued {
		t.Fatalf("live wait re-poll: code %d %q status %d, want queued", r.Code, r.Msg, r.Status)
	}
	r = apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	if r.Code != fsm.OK || r.Status != fsm.StatusGranted || r.Token != tk || st != fsm.StatusGranted {
		t.Fatalf("re-poll after the grant: %+v, want granted with token %d", r, tk)
	}
}

// A Cancel applied before its Acquire (the acquire still in flight through a
// follower) makes the late Acquire a refused duplicate: it neither queues
// nor takes the lock for a caller that gave up.
func TestCancelOvertakesAcquire(t *testing.T) {
	f := fsm.New(nil)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	apply(t, f, &fsmv1.CreateSession{SessionId: "w", TtlMs: 10000})
	apply(t, f, &fsmv1.Cancel{SessionId: "w", Seq: 2, Ack: 1, Name: "a", AcquireSeq: 1})
	b, err := fsm.Encode(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	r := f.ApplyCommand(b)
	if r.Code != fsm.CodeCancelled || !r.Duplicate {
		t.Fatalf("late acquire: %+v, want a cancelled duplicate", r)
	}
	if _, ok := f.Describe("a"); ok {
		t.Fatal("late acquire of a cancelled request queued or took the lock")
	}
}

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
