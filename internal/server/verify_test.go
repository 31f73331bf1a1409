package server

import (
	"sync"
	"testing"
	"time"
)

// TestLinearizableCoalescesVerifyLeader: many concurrent reads on the real
// leader of a three-node cluster all succeed and share VerifyLeader calls (each one a round
// of heartbeats to the followers).
func TestLinearizableCoalescesVerifyLeader(t *testing.T) {
	c := newTestCluster(t, 3, defaultClusterOpts())
	i, err := c.waitLeader(15 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s := c.server(i)
	const workers, each = 64, 50
	before := s.nd.Hooks().VerifyChecks()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				if err := s.node.Linearizable(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := s.nd.Hooks().VerifyChecks() - before
	t.Logf("%d linearizable calls, %d VerifyLeader calls", workers*each, got)
	// How many checks overlap depends on scheduling (a VerifyLeader on the
	// in-memory transport takes microseconds); TestVerifierUnderLoad
	// counts them in fake time.
	if got >= workers*each {
		t.Fatalf("VerifyLeader calls: %d for %d requests, want fewer", got, workers*each)
	}
}
