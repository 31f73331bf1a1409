package node

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestFanoutFeedsEveryConsumer: the FSM's one event stream reaches every
// consumer on the node: the session leases (created, removed, revoked), the
// completion-mark and lock-delay timers (started, ended), the blocked
// Acquire calls (granted, dropped) and the watch history (lock events
// only). A kind the Fanout stopped handing on fails here.
func TestFanoutFeedsEveryConsumer(t *testing.T) {
	never := func(string, uint64) {}
	o := &Fanout{Lease: lease.New(time.Hour, never), Marks: lease.New(0, never), Delays: lease.New(0, never), Waiters: NewWaiters(nil), Hub: NewHub(64)}
	for _, m := range []*lease.Manager{o.Lease, o.Marks, o.Delays} {
		m.Promote(1, nil) // active, as on the leader; no timer fires within the test (TTLs of a minute)
		defer m.Demote()
	}
	f := fsm.New(o)
	var index uint64
	apply := func(ct fsm.CmdType, m proto.Message) {
		t.Helper()
		b, err := fsm.Encode(ct, m)
		if err != nil {
			t.Fatal(err)
		}
		index++
		if r := f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: b}).(*fsm.Result); r.Code != fsm.OK {
			t.Fatalf("apply %T: %v", m, r.Err())
		}
	}
	apply(fsm.CmdInit, &fsmv1.Init{ClusterId: "c", Epoch: 100})
	for _, id := range []string{"a", "b", "c"} {
		apply(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 60_000})
	}
	if got := o.Lease.Len(); got != 3 {
		t.Fatalf("leases after three creations: %d, want 3", got)
	}
	apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "a", Seq: 1, Name: "x", Mode: fsm.ModeExclusive, LockDelayMs: 60_000})
	apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "b", Seq: 1, Name: "x", Mode: fsm.ModeExclusive, Wait: true})
	granted, stopB := o.Waiters.Watch(WaitKey{"b", "x", 1})
	defer stopB()
	apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "c", Seq: 1, Name: "x", Mode: fsm.ModeExclusive, Wait: true})
	dropped, stopC := o.Waiters.Watch(WaitKey{"c", "x", 1})
	defer stopC()

	apply(fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: "a", Term: 1})
	if _, ok := o.Lease.Deadline("a"); ok || o.Lease.Len() != 2 {
		t.Fatalf("lease of the expired session still kept (%d leases)", o.Lease.Len())
	}
	if got := o.Delays.Len(); got != 1 {
		t.Fatalf("lock-delay timers after the holder expired: %d, want 1", got)
	}
	apply(fsm.CmdUndelay, &fsmv1.Undelay{Name: "x", Token: 101, Term: 1})
	if got := o.Delays.Len(); got != 0 {
		t.Fatalf("lock-delay timers after the delay ended: %d, want 0", got)
	}
	select {
	case w := <-granted:
		if w.Dropped || w.Token != 102 {
			t.Fatalf("b's wait: got %+v, want granted with token 102", w)
		}
	default:
		t.Fatal("b's blocked call was not woken by its grant")
	}
	apply(fsm.CmdComplete, &fsmv1.Complete{SessionId: "b", Seq: 2, Name: "x", Token: 102, RetentionMs: 60_000})
	if got := o.Marks.Len(); got != 1 {
		t.Fatalf("mark timers after Complete: %d, want 1", got)
	}
	select {
	case w := <-dropped:
		if !w.Dropped {
			t.Fatalf("c's wait: got %+v, want dropped", w)
		}
	default:
		t.Fatal("c's blocked call was not woken when its wait was dropped")
	}
	apply(fsm.CmdClearMark, &fsmv1.ClearMark{Name: "x", Token: 102, Term: 1})
	if got := o.Marks.Len(); got != 0 {
		t.Fatalf("mark timers after the mark was cleared: %d, want 0", got)
	}
	apply(fsm.CmdRevokeSession, &fsmv1.RevokeSession{SessionIds: []string{"c"}})
	if _, err := o.Lease.KeepAlive("c", time.Now()); !errors.Is(err, lease.ErrRevoked) {
		t.Fatalf("keepalive of the revoked session: %v, want %v", err, lease.ErrRevoked)
	}
	// Lock events only: a granted, b and c queued, a expired and its delay
	// started, the delay ended and b granted, b completed and c dequeued,
	// the mark cleared. The session events (three created, one removed,
	// one revoked) pass the history by.
	if got := o.Hub.Stored(); got != 10 {
		t.Fatalf("watch history holds %d events, want the 10 lock events", got)
	}
}
