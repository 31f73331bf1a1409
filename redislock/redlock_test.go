package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/redislock"
)

// TestRedlockQuorum (acceptance 2): with 1 of 3 nodes killed locks still
// work; with 2 of 3 killed (or stopped) an acquire fails with ErrNoQuorum
// within the caller's deadline plus one per-node timeout, a held lock is
// given up by its deadline, and nothing hangs.
func TestRedlockQuorum(t *testing.T) {
	t.Parallel()
	const (
		ttl         = 2 * time.Second
		nodeTimeout = 300 * time.Millisecond
		// slack covers scheduling on a loaded 2-core machine; the bound
		// itself is deadline + one per-node timeout.
		slack = 250 * time.Millisecond
	)
	srvs := servers(t, 3)
	r := newRedlock(t, srvs, redislock.WithTTL(ttl), redislock.WithRequestTimeout(nodeTimeout))
	other := newRedlock(t, srvs, redislock.WithTTL(ttl), redislock.WithRequestTimeout(nodeTimeout))
	ctx := ctxT(t, 30*time.Second)

	m := r.NewMutex("quorum")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Token() != 0 {
		t.Errorf("Redlock token: got %d, want 0 (Redlock issues none)", m.Token())
	}
	if err := other.NewMutex("quorum").TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
		t.Errorf("TryLock of a held Redlock lock: got %v, want ErrBusy", err)
	}

	srvs[0].Stop()
	// The hold survives renewals with one node gone, and locks still work.
	select {
	case <-m.Done():
		t.Fatalf("hold lost with 2 of 3 nodes up: %v", m.Err())
	case <-time.After(ttl): // three renewal rounds
	}
	if err := m.Unlock(ctx); err != nil {
		t.Errorf("Unlock with 2 of 3 nodes: %v", err)
	}
	for range 5 {
		m2 := other.NewMutex("quorum")
		if err := m2.Lock(ctx); err != nil {
			t.Fatalf("Lock with 2 of 3 nodes: %v", err)
		}
		if err := m2.Unlock(ctx); err != nil {
			t.Fatalf("Unlock with 2 of 3 nodes: %v", err)
		}
	}

	// A hold in place when the second node goes is given up by the client
	// deadline (renewals cannot reach a majority).
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	firedAt := make(chan time.Time, 1)
	context.AfterFunc(m.Context(), func() { firedAt <- time.Now() })
	srvs[1].Stop()
	waitDone(t, m.Done(), 2*ttl)
	fired := <-firedAt
	if !errors.Is(m.Err(), lockd.ErrLeaseLost) {
		t.Errorf("Err after losing the quorum: got %v, want ErrLeaseLost", m.Err())
	}
	// Deadline no longer moves: it is the one the hold was lost at.
	if late := fired.Sub(m.Deadline()); late > 4*slack {
		t.Errorf("hold given up %v after its deadline", late)
	}

	// Acquires fail with ErrNoQuorum, fast.
	start := time.Now()
	err := other.NewMutex("quorum2").TryLock(ctx)
	if !errors.Is(err, redislock.ErrNoQuorum) || !errors.Is(err, lockd.ErrUnavailable) {
		t.Errorf("TryLock with 1 of 3 nodes: got %v, want ErrNoQuorum (and ErrUnavailable)", err)
	}
	if d := time.Since(start); d > 2*nodeTimeout+slack {
		t.Errorf("TryLock with 1 of 3 nodes took %v", d)
	}
	checkBoundedLock(t, other, nodeTimeout, slack)

	// Stopped (SIGSTOP) rather than dead: requests hang instead of being
	// refused; the per-node timeout still bounds everything.
	srvs[0].Start()
	srvs[1].Start()
	srvs[0].Pause()
	srvs[1].Pause()
	defer srvs[0].Resume()
	defer srvs[1].Resume()
	start = time.Now()
	if err := other.NewMutex("quorum3").TryLock(ctx); !errors.Is(err, redislock.ErrNoQuorum) {
		t.Errorf("TryLock with 2 of 3 nodes stopped: got %v, want ErrNoQuorum", err)
	}
	if d := time.Since(start); d > 2*nodeTimeout+slack {
		t.Errorf("TryLock with 2 of 3 nodes stopped took %v, want at most two per-node timeouts (acquire, undo)", d)
	}
	checkBoundedLock(t, other, nodeTimeout, slack)
}

// checkBoundedLock checks that Lock without a quorum returns ErrNoQuorum
// and the context's error no later than its deadline plus one per-node
// timeout.
func checkBoundedLock(t *testing.T, r *redislock.Redlock, nodeTimeout, slack time.Duration) {
	t.Helper()
	const wait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dl, _ := ctx.Deadline()
	err := r.NewMutex("bounded").Lock(ctx)
	over := time.Since(dl)
	if !errors.Is(err, redislock.ErrNoQuorum) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock without quorum: got %v, want ErrNoQuorum and DeadlineExceeded", err)
	}
	if over > nodeTimeout+slack {
		t.Errorf("Lock without quorum returned %v after its deadline, want at most one per-node timeout (%v)", over, nodeTimeout)
	}
	t.Logf("Lock without quorum returned %v after its %v deadline: %v", over, wait, err)
}

// TestRedlockConstructor: node counts and quorum at construction.
func TestRedlockConstructor(t *testing.T) {
	t.Parallel()
	srvs := servers(t, 3)
	ctx := ctxT(t, 10*time.Second)
	nodes := clients(t, srvs)
	for _, bad := range [][]redis.UniversalClient{nodes[:1], nodes[:2], append(nodes[:3:3], nodes[0])} {
		if _, err := redislock.NewRedlock(ctx, bad); !errors.Is(err, lockd.ErrInvalidArgument) {
			t.Errorf("NewRedlock with %d nodes: got %v, want ErrInvalidArgument", len(bad), err)
		}
	}
	srvs[0].Stop()
	if _, err := redislock.NewRedlock(ctx, clients(t, srvs)); err != nil {
		t.Errorf("NewRedlock with 2 of 3 nodes up: %v", err)
	}
	srvs[1].Stop()
	if _, err := redislock.NewRedlock(ctx, clients(t, srvs)); !errors.Is(err, redislock.ErrNoQuorum) {
		t.Errorf("NewRedlock with 1 of 3 nodes up: got %v, want ErrNoQuorum", err)
	}
}
