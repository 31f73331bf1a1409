package fsm_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

func applyRaw(t *testing.T, f *fsm.FSM, ct fsm.CmdType, m proto.Message) *fsm.Result {
	t.Helper()
	b, err := fsm.Encode(ct, m)
	if err != nil {
		t.Fatal(err)
	}
	return f.ApplyCommand(b)
}

// TestCompleteMarksJobDone: completing a held lock releases it, answers its
// waiters "already done", refuses later acquires until the mark is
// cleared, and the mark survives a snapshot.
func TestCompleteMarksJobDone(t *testing.T) {
	rec := &recorder{}
	f := fsm.New(rec)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	for _, id := range []string{"a", "b", "c"} {
		apply(t, f, &fsmv1.CreateSession{SessionId: id, TtlMs: 10000})
	}
	g := apply(t, f, &fsmv1.Acquire{SessionId: "a", Seq: 1, Ack: 1, Name: "invoices", Mode: excl})
	apply(t, f, &fsmv1.Acquire{SessionId: "b", Seq: 1, Ack: 1, Name: "invoices", Mode: excl, Wait: true})
	rec.take()

	if r := applyRaw(t, f, fsm.CmdComplete, &fsmv1.Complete{SessionId: "c", Seq: 1, Ack: 1, Name: "invoices", Token: g.Token, RetentionMs: 1000}); r.Code != fsm.CodeNotHeld {
		t.Fatalf("complete by a non-holder: %+v, want CodeNotHeld", r)
	}
	if r := applyRaw(t, f, fsm.CmdComplete, &fsmv1.Complete{SessionId: "a", Seq: 2, Ack: 2, Name: "invoices", Token: g.Token}); r.Code != fsm.CodeInvalid {
		t.Fatalf("complete without retention: %+v, want CodeInvalid", r)
	}
	apply(t, f, &fsmv1.Complete{SessionId: "a", Seq: 3, Ack: 3, Name: "invoices", Token: g.Token, RetentionMs: 60000})
	if got, want := rec.take(), []string{`marked "invoices" ` + strconv.FormatUint(g.Token, 10) + ` 60000`, `dropped b "invoices" 1`}; !slices.Equal(got, want) {
		t.Fatalf("events: got %q, want %q", got, want)
	}
	info, ok := f.Describe("invoices")
	if !ok || info.Mark == nil || info.Mark.Token != g.Token || len(info.Holders) != 0 || len(info.Waiters) != 0 {
		t.Fatalf("describe after complete: %+v", info)
	}
	r := applyRaw(t, f, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "c", Seq: 2, Ack: 2, Name: "invoices", Mode: excl, Wait: true})
	if r.Code != fsm.CodeAlreadyDone || r.Mark == nil || r.Mark.Session != "a" {
		t.Fatalf("acquire of a done lock: %+v, want CodeAlreadyDone naming a", r)
	}

	// The mark survives a snapshot.
	g2 := fsm.New(nil)
	if err := g2.RestoreBytes(persist(t, f)); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(g2.State(), f.State()) {
		t.Fatal("state with a mark differs after restore")
	}

	// A stale clear (another token) changes nothing; the right one frees it.
	apply(t, f, &fsmv1.ClearMark{Name: "invoices", Token: g.Token + 100})
	if _, ok := f.Describe("invoices"); !ok {
		t.Fatal("clear with another token removed the mark")
	}
	apply(t, f, &fsmv1.ClearMark{Name: "invoices", Token: g.Token})
	if _, ok := f.Describe("invoices"); ok {
		t.Fatal("lock still there after its mark was cleared")
	}
	if g3 := apply(t, f, &fsmv1.Acquire{SessionId: "c", Seq: 3, Ack: 3, Name: "invoices", Mode: excl}); g3.Token <= g.Token {
		t.Fatalf("grant after the mark: token %d not above %d", g3.Token, g.Token)
	}
}

// TestLockDelay: after a holder's session expires (not a clean release),
// a lock with a lock-delay grants nothing until the leader's Undelay; a
// clean release or close hands over at once.
func TestLockDelay(t *testing.T) {
	rec := &recorder{}
	f := fsm.New(rec)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	for _, id := range []string{"a", "b", "c", "d"} {
		apply(t, f, &fsmv1.CreateSession{SessionId: id, TtlMs: 10000})
	}
	if r := applyRaw(t, f, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "a", Seq: 1, Ack: 1, Name: "x", Mode: excl, LockDelayMs: -1}); r.Code != fsm.CodeInvalid {
		t.Fatalf("negative lock-delay: %+v, want CodeInvalid", r)
	}
	g := apply(t, f, &fsmv1.Acquire{SessionId: "a", Seq: 2, Ack: 2, Name: "x", Mode: excl, LockDelayMs: 5000})
	apply(t, f, &fsmv1.Acquire{SessionId: "b", Seq: 1, Ack: 1, Name: "x", Mode: excl, Wait: true})
	rec.take()
	apply(t, f, &fsmv1.ExpireSession{SessionId: "a"})
	if got := rec.take(); !slices.Contains(got, `lockdelay "x" 5000`) {
		t.Fatalf("events after expiry: %q, want a lock-delay", got)
	}
	info, _ := f.Describe("x")
	if !info.Delayed || len(info.Holders) != 0 || len(info.Waiters) != 1 {
		t.Fatalf("after expiry: %+v, want delayed with b still waiting", info)
	}
	if r := applyRaw(t, f, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "c", Seq: 1, Ack: 1, Name: "x", Mode: excl}); r.Code != fsm.CodeBusy {
		t.Fatalf("try during the lock-delay: %+v, want CodeBusy", r)
	}
	apply(t, f, &fsmv1.Undelay{Name: "x", Token: g.Token + 100}) // another delay's timer
	if info, _ = f.Describe("x"); !info.Delayed {
		t.Fatal("an Undelay naming another delay ended this one")
	}
	apply(t, f, &fsmv1.Undelay{Name: "x", Token: g.Token})
	info, _ = f.Describe("x")
	if info.Delayed || len(info.Holders) != 1 || info.Holders[0].Session != "b" || info.Holders[0].Token <= g.Token {
		t.Fatalf("after undelay: %+v, want b holding with a larger token", info)
	}
	// A clean release does not delay.
	apply(t, f, &fsmv1.Acquire{SessionId: "d", Seq: 1, Ack: 1, Name: "x", Mode: excl, Wait: true})
	apply(t, f, &fsmv1.Release{SessionId: "b", Seq: 2, Ack: 2, Name: "x", Token: info.Holders[0].Token})
	if info, _ = f.Describe("x"); info.Delayed || len(info.Holders) != 1 || info.Holders[0].Session != "d" {
		t.Fatalf("after a clean release: %+v, want d holding at once", info)
	}
	// The delay state survives a snapshot.
	apply(t, f, &fsmv1.ExpireSession{SessionId: "d"})
	g2 := fsm.New(nil)
	if err := g2.RestoreBytes(persist(t, f)); err != nil {
		t.Fatal(err)
	}
	if info, _ := g2.Describe("x"); !info.Delayed || info.Delay != 5*time.Second {
		t.Fatalf("restored: %+v, want delayed", info)
	}
}

// A second expired holder restarts the lock-delay. The Undelay the leader
// proposed when the FIRST delay's timer fired (naming a's token), still in
// flight when b's ExpireSession is applied, must not end the restarted
// delay: Undelay names the delay it ends.
func TestStaleUndelayDoesNotEndRestartedDelay(t *testing.T) {
	rec := &recorder{}
	f := fsm.New(rec)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	for _, id := range []string{"a", "b", "w"} {
		apply(t, f, &fsmv1.CreateSession{SessionId: id, TtlMs: 10000})
	}
	two := uint32(2)
	ga := apply(t, f, &fsmv1.Acquire{SessionId: "a", Seq: 1, Ack: 1, Name: "x", Mode: fsm.ModeShared, Limit: &two, LockDelayMs: 5000})
	apply(t, f, &fsmv1.Acquire{SessionId: "b", Seq: 1, Ack: 1, Name: "x", Mode: fsm.ModeShared})
	apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "x", Mode: excl, Wait: true})
	apply(t, f, &fsmv1.ExpireSession{SessionId: "a", Term: 7}) // delay #1, leader timer T1
	rec.take()
	// t0+5s: T1 fires; the leader verifies leadership and proposes
	// Undelay{x, 7}. Meanwhile b's lease timer proposed ExpireSession{b, 7},
	// which is ordered first in the log.
	apply(t, f, &fsmv1.ExpireSession{SessionId: "b", Term: 7})
	if got := rec.take(); !slices.Contains(got, `lockdelay "x" 5000`) {
		t.Fatalf("b's expiry: %q, want the delay restarted", got)
	}
	apply(t, f, &fsmv1.Undelay{Name: "x", Term: 7, Token: ga.Token}) // T1's, stale
	if info, _ := f.Describe("x"); !info.Delayed || len(info.Holders) > 0 {
		t.Fatalf("T1's Undelay ended the delay restarted by b's expiry: delayed=%v holders=%+v (granted 0 s after b expired, not 5 s)", info.Delayed, info.Holders)
	}
}
