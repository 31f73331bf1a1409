package node

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestRevokeGraceTimers: the fanout starts a revoke-grace timer for an
// admin's request on a lock whose policy has a grace, and for nothing else
// (a non-admin request, a lock without the policy); a repeated request
// does not restart it; it fires once the grace ran out in full, with the
// hold's key; a hold that ends within its grace stops its timer; a new
// leader (Promote from WithRevokeGraces) restarts a running grace in full.
func TestRevokeGraceTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fired := make(chan string, 8)
		graces := lease.New(0, func(key string, _ uint64) { fired <- key })
		graces.Promote(1, nil)
		defer graces.Demote()
		never := func(string, uint64) {} // the other timers stay inactive
		f := fsm.New(&Fanout{Lease: lease.New(0, never), Marks: lease.New(0, never), Delays: lease.New(0, never), Graces: graces, Waiters: NewWaiters(nil), Hub: NewHub(64)})
		var index uint64
		apply := func(ct fsm.CmdType, m proto.Message) *fsm.Result {
			t.Helper()
			b, err := fsm.Encode(ct, m)
			if err != nil {
				t.Fatal(err)
			}
			index++
			r := f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: b}).(*fsm.Result)
			if r.Code != fsm.OK {
				t.Fatalf("apply %T: %v", m, r.Err())
			}
			return r
		}
		noneFired := func(what string) {
			t.Helper()
			synctest.Wait()
			select {
			case k := <-fired:
				t.Fatalf("%s: timer fired for %q", what, k)
			default:
			}
		}
		apply(fsm.CmdInit, &fsmv1.Init{ClusterId: "c", Epoch: 100})
		for _, id := range []string{"a", "b"} {
			apply(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 3_600_000})
		}
		apply(fsm.CmdSetLockPolicy, &fsmv1.SetLockPolicy{Name: "x", RevokeGraceMs: 2000})
		apply(fsm.CmdSetLockPolicy, &fsmv1.SetLockPolicy{Name: "y", RevokeGraceMs: 2000})
		tx := apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "a", Seq: 1, Name: "x", Mode: fsm.ModeExclusive}).Token
		ty := apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "b", Seq: 1, Name: "y", Mode: fsm.ModeExclusive}).Token
		apply(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "b", Seq: 2, Name: "z", Mode: fsm.ModeExclusive})

		apply(fsm.CmdRequestRelease, &fsmv1.RequestRelease{Name: "x", Reason: "not admin"})
		apply(fsm.CmdRequestRelease, &fsmv1.RequestRelease{Name: "z", Reason: "no policy", Admin: true})
		if n := graces.Len(); n != 0 {
			t.Fatalf("timers after a non-admin request and one on a lock without a grace: %d, want 0", n)
		}
		if r := apply(fsm.CmdRequestRelease, &fsmv1.RequestRelease{Name: "x", Reason: "deploy", Admin: true}); r.MaxHold != 2*time.Second {
			t.Fatalf("grace started: %v, want 2s", r.MaxHold)
		}
		apply(fsm.CmdRequestRelease, &fsmv1.RequestRelease{Name: "y", Reason: "deploy", Admin: true})
		if n := graces.Len(); n != 2 {
			t.Fatalf("timers after two admin requests: %d, want 2", n)
		}
		time.Sleep(1500 * time.Millisecond)
		// A repeat does not restart x's grace; y's hold ends within its own.
		apply(fsm.CmdRequestRelease, &fsmv1.RequestRelease{Name: "x", Reason: "again", Admin: true})
		apply(fsm.CmdRelease, &fsmv1.Release{SessionId: "b", Seq: 3, Name: "y", Token: ty})
		if n := graces.Len(); n != 1 {
			t.Fatalf("timers after y's holder released: %d, want 1", n)
		}
		time.Sleep(499 * time.Millisecond)
		noneFired("before the grace ran out")
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		select {
		case k := <-fired:
			if k != holdKey("x", "a", tx) {
				t.Fatalf("timer fired for %q, want x's hold", k)
			}
		default:
			t.Fatal("grace ran out, no timer fired")
		}
		noneFired("after x fired (y released)")

		// A new leader restarts x's grace in full.
		graces.Demote()
		f.WithRevokeGraces(func(bs []fsm.Budget) {
			if len(bs) != 1 || bs[0].Name != "x" || bs[0].Token != tx || bs[0].MaxHold != 2*time.Second {
				t.Fatalf("WithRevokeGraces: %+v, want x's hold with 2s", bs)
			}
			graces.Promote(2, []lease.Entry{{ID: holdKey(bs[0].Name, bs[0].Session, bs[0].Token), TTL: bs[0].MaxHold}})
		})
		time.Sleep(1999 * time.Millisecond)
		noneFired("new leader, before the grace ran out in full")
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if len(fired) != 1 {
			t.Fatalf("new leader: %d timers fired, want x's", len(fired))
		}
		<-fired
		// The hold ends (its session expires): its timer is gone.
		apply(fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: "a", Term: 1})
		if n := graces.Len(); n != 0 {
			t.Fatalf("timers after x's holder expired: %d, want 0", n)
		}
	})
}
