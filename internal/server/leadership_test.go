package server

import (
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestDelayTimerEntries: an expired holder starts a lock-delay timer on the
// leader, keyed by the lock and the expired hold's token; the Undelay that
// ends it removes the entry (no entry piles up for the term), and an
// Undelay naming another delay changes nothing.
func TestDelayTimerEntries(t *testing.T) {
	s := startServer(t, testConfig(t.TempDir()))
	defer s.Close()
	propose(t, s, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "a", TtlMs: 60000})
	g := propose(t, s, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "a", Seq: 1, Name: "x", Mode: fsm.ModeExclusive, LockDelayMs: 3600 * 1000})
	propose(t, s, fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: "a"})
	key := markKey("x", g.Token)
	if _, ok := s.delays.Deadline(key); !ok {
		t.Fatal("no lock-delay timer after the holder expired")
	}
	propose(t, s, fsm.CmdUndelay, &fsmv1.Undelay{Name: "x", Token: g.Token + 1})
	if l, ok := s.fsm.Describe("x"); !ok || !l.Delayed {
		t.Fatal("an Undelay naming another delay ended this one")
	}
	propose(t, s, fsm.CmdUndelay, &fsmv1.Undelay{Name: "x", Token: g.Token})
	if _, ok := s.fsm.Describe("x"); ok {
		t.Fatal("lock still there after its delay ended")
	}
	if _, ok := s.delays.Deadline(key); ok {
		t.Fatal("the ended delay's timer entry stays in the manager")
	}
}
