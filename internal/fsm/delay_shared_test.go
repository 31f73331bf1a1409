package fsm_test

import (
	"slices"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

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
