package node

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"
)

// fakeCheck stands in for VerifyLeader where a test must hold a check in
// flight while leadership is lost: a real cluster cannot stop a check at an
// exact point. A check answers for the leadership of the moment it started,
// like VerifyLeader (followers that acknowledged this leader's heartbeat).
type fakeCheck struct {
	leader atomic.Bool
	gate   chan struct{} // a check waits here before it answers
	calls  atomic.Int64
}

func (f *fakeCheck) run() error {
	f.calls.Add(1)
	ok := f.leader.Load()
	<-f.gate
	if !ok {
		return raft.ErrNotLeader
	}
	return nil
}

// TestVerifierNeverReusesOlderCheck: a request that arrives after
// leadership was lost fails, even though a check that started before the
// loss (while this node still led) is in flight and succeeds. Reusing that
// check would let a deposed leader extend a lease a newer leader expired.
func TestVerifierNeverReusesOlderCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var v Verifier
		f := &fakeCheck{gate: make(chan struct{})}
		f.leader.Store(true)
		var errA, errB error
		var wg sync.WaitGroup
		wg.Go(func() { errA = v.Do(f.run) }) // received while leader
		synctest.Wait()                      // A's check is in flight
		f.leader.Store(false)                // a newer leader is elected
		wg.Go(func() { errB = v.Do(f.run) }) // received after the loss
		synctest.Wait()
		close(f.gate)
		wg.Wait()
		if errA != nil {
			t.Fatalf("request received while leader: %v", errA)
		}
		if !errors.Is(errB, raft.ErrNotLeader) {
			t.Fatalf("request received after leadership was lost: got %v, want ErrNotLeader (answered by a check that started before it arrived)", errB)
		}
		if got := f.calls.Load(); got != 2 {
			t.Fatalf("checks: %d, want 2", got)
		}
	})
}

// TestVerifierSharesNextCheck: every request that arrives while a check is
// in flight shares the one next check.
func TestVerifierSharesNextCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var v Verifier
		f := &fakeCheck{gate: make(chan struct{})}
		f.leader.Store(true)
		var wg sync.WaitGroup
		var failed atomic.Int64
		call := func() {
			if v.Do(f.run) != nil {
				failed.Add(1)
			}
		}
		wg.Go(call)
		synctest.Wait()
		for range 100 {
			wg.Go(call)
		}
		synctest.Wait()
		close(f.gate)
		wg.Wait()
		if got := f.calls.Load(); got != 2 {
			t.Fatalf("checks for 101 requests: %d, want 2 (the one in flight and one shared)", got)
		}
		if failed.Load() != 0 {
			t.Fatalf("%d requests failed", failed.Load())
		}
		// Idle again: the next request starts its own check at once.
		if err := v.Do(f.run); err != nil || f.calls.Load() != 3 {
			t.Fatalf("after idle: err %v, checks %d, want nil, 3", err, f.calls.Load())
		}
	})
}

// TestVerifierUnderLoad: 64 callers in a loop, each check taking a
// heartbeat round trip (1 ms of fake time), share far fewer checks than
// they make calls.
func TestVerifierUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var v Verifier
		var wg sync.WaitGroup
		const workers, each = 64, 50
		for range workers {
			wg.Go(func() {
				for range each {
					if err := v.Do(func() error { time.Sleep(time.Millisecond); return nil }); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if got := v.Checks(); got > workers*each/16 {
			t.Fatalf("checks: %d for %d calls, want at most %d", got, workers*each, workers*each/16)
		}
	})
}
