package server

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/node"
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
	key := node.MarkKey("x", g.Token)
	if _, ok := s.nd.Hooks().Delays().Deadline(key); !ok {
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
	if _, ok := s.nd.Hooks().Delays().Deadline(key); ok {
		t.Fatal("the ended delay's timer entry stays in the manager")
	}
}

// TestCloseEndsRaftCallsInFlight: Raft calls racing with Close (a lease
// timer's VerifyLeader, a handler's proposal) all return once Close has:
// hashicorp/raft never answers a future still queued on its channels when
// it shuts down, so a call that slipped in just before would block forever.
func TestCloseEndsRaftCallsInFlight(t *testing.T) {
	s := startServer(t, testConfig(t.TempDir()))
	var wg sync.WaitGroup
	var calls atomic.Int64
	for i := range 8 {
		wg.Go(func() {
			for n := 0; ; n++ {
				if err := s.node.Linearizable(); err != nil {
					return
				}
				id := fmt.Sprintf("w%d-%d", i, n)
				if _, err := s.node.Propose(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 60000}); err != nil {
					return
				}
				calls.Add(1)
			}
		})
	}
	for deadline := time.Now().Add(10 * time.Second); calls.Load() < 200; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no proposals")
		}
	}
	s.Close()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a Raft call racing with Close never returned")
	}
}
