package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	"google.golang.org/protobuf/proto"
)

func mustApply(t *testing.T, f *fsm.FSM, ct fsm.CmdType, m proto.Message) *fsm.Result {
	t.Helper()
	b, err := fsm.Encode(ct, m)
	if err != nil {
		t.Fatal(err)
	}
	r := f.ApplyCommand(b)
	if r.Code != fsm.OK {
		t.Fatalf("apply %d: %v", ct, r.Err())
	}
	return r
}

// TestReleaseWakesExactlyOne: with ten blocked acquire calls on one mutex,
// each release wakes exactly the next one in queue order, and the wake-up
// counter (lockd_lock_waiters_woken_total) moves by exactly one.
func TestReleaseWakesExactlyOne(t *testing.T) {
	woken := 0
	w := NewWaiters(func() { woken++ })
	idle := func() *lease.Manager { return lease.New(time.Second, func(string, uint64) {}) }
	f := fsm.New(&Fanout{Lease: idle(), Marks: idle(), Delays: idle(), Waiters: w, Hub: NewHub(64)})
	mustApply(t, f, fsm.CmdInit, &fsmv1.Init{ClusterId: "c", Epoch: 100})
	const n = 10
	chans := make([]<-chan WaitOutcome, n+1)
	for i := 0; i <= n; i++ {
		id := fmt.Sprint("s", i)
		mustApply(t, f, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 1000})
		r := mustApply(t, f, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: id, Seq: 1, Name: "m", Mode: fsm.ModeExclusive, Wait: true})
		if i > 0 {
			var stop func()
			chans[i], stop = w.Watch(WaitKey{id, "m", 1})
			defer stop()
			if r.Status != fsm.StatusQueued {
				t.Fatalf("s%d: status %d, want queued", i, r.Status)
			}
		}
	}
	token := uint64(101)
	for i := 0; i < n; i++ {
		before := woken
		mustApply(t, f, fsm.CmdRelease, &fsmv1.Release{SessionId: fmt.Sprint("s", i), Seq: 2, Name: "m", Token: token})
		if got := woken - before; got != 1 {
			t.Fatalf("release %d woke %d calls, want 1", i, got)
		}
		select {
		case o := <-chans[i+1]:
			if o.Dropped || o.Token != token+1 {
				t.Fatalf("s%d: got %+v, want grant with token %d", i+1, o, token+1)
			}
		default:
			t.Fatalf("s%d was not woken", i+1)
		}
		for j := i + 2; j <= n; j++ {
			select {
			case o := <-chans[j]:
				t.Fatalf("s%d woken out of turn: %+v", j, o)
			default:
			}
		}
		token++
	}
}
