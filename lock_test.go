package lockd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// newClient returns a client of srv, closed by t.Cleanup.
func newClient(t testing.TB, srv *lockdtest.Server, opts ...lockd.Option) *lockd.Client {
	t.Helper()
	c, err := lockd.New(append([]lockd.Option{lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func newSession(t testing.TB, c *lockd.Client, opts ...lockd.SessionOption) *lockd.Session {
	t.Helper()
	s, err := c.NewSession(t.Context(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitQueue waits until the lock's queue has n waiters, and returns it.
// It asks the server (linearizable reads) rather than sleeping.
func waitQueue(t testing.TB, c *lockd.Client, name string, n int) []*lockdv1.Waiter {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		resp, err := c.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
		if err != nil {
			t.Fatalf("waiting for %d waiters on %q: %v", n, name, err)
		}
		if w := resp.Msg.GetLock().GetWaiters(); len(w) == n {
			return w
		}
	}
}

func describe(t testing.TB, c *lockd.Client, name string) *lockdv1.LockInfo {
	t.Helper()
	resp, err := c.Service().DescribeLock(t.Context(), connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetLock()
}

func TestMutexExclusion(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	const workers, rounds = 8, 15
	var inside atomic.Int32
	var mu sync.Mutex // guards lastToken, grants
	var lastToken uint64
	grants := 0
	var wg sync.WaitGroup
	for w := range workers {
		s := newSession(t, c, lockd.WithOwner(fmt.Sprintf("worker-%d", w)))
		m := s.NewMutex("invoices/2025-01")
		wg.Go(func() {
			for range rounds {
				if err := m.Lock(t.Context()); err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders inside the critical section", n)
				}
				mu.Lock()
				if tok := m.Token(); tok <= lastToken {
					t.Errorf("token %d not above the previous grant's %d", tok, lastToken)
				} else {
					lastToken = tok
				}
				grants++
				mu.Unlock()
				if m.Err() != nil || m.Context().Err() != nil {
					t.Errorf("held lock reports %v", m.Err())
				}
				inside.Add(-1)
				if err := m.Unlock(t.Context()); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if grants != workers*rounds {
		t.Errorf("%d grants, want %d", grants, workers*rounds)
	}
}

func TestMutexFIFO(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	holder := newSession(t, c).NewMutex("report")
	if err := holder.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	const n = 6
	order := make(chan int, n)
	mutexes := make([]*lockd.Mutex, n)
	var wg sync.WaitGroup
	for i := range n {
		mutexes[i] = newSession(t, c).NewMutex("report")
		wg.Go(func() {
			if err := mutexes[i].Lock(t.Context()); err != nil {
				t.Error(err)
				return
			}
			order <- i
			if err := mutexes[i].Unlock(t.Context()); err != nil {
				t.Error(err)
			}
		})
		waitQueue(t, c, "report", i+1) // queue in a known order
	}
	if err := holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Errorf("waiter %d granted in place %d", got, want)
		}
		want++
	}
}

func TestTryLockBusy(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	s1 := newSession(t, c, lockd.WithOwner("billing-1"))
	m1 := s1.NewMutex("invoices", lockd.WithValue([]byte("january run")))
	if err := m1.TryLock(t.Context()); err != nil {
		t.Fatal(err)
	}
	m2 := newSession(t, c).NewMutex("invoices")
	err := m2.TryLock(t.Context())
	var be *lockd.BusyError
	if !errors.Is(err, lockd.ErrBusy) || !errors.As(err, &be) {
		t.Fatalf("TryLock of a held lock = %v, want a *BusyError", err)
	}
	if len(be.Holders) != 1 {
		t.Fatalf("holders %+v, want one", be.Holders)
	}
	h := be.Holders[0]
	if h.SessionID != s1.ID() || h.Owner != "billing-1" || h.Token != m1.Token() || string(h.Value) != "january run" || h.Shared {
		t.Errorf("holder %+v", h)
	}
	if m2.Token() != 0 || !errors.Is(m2.Err(), lockd.ErrNotHeld) {
		t.Errorf("busy lock reports token %d, err %v", m2.Token(), m2.Err())
	}
	// Not re-entrant, even through another handle of the same session.
	if err := s1.NewMutex("invoices").TryLock(t.Context()); !errors.Is(err, lockd.ErrAlreadyHeld) {
		t.Errorf("second acquire by the holder's session = %v, want ErrAlreadyHeld", err)
	}
	if err := m1.Lock(t.Context()); !errors.Is(err, lockd.ErrAlreadyHeld) {
		t.Errorf("Lock of a held Mutex = %v, want ErrAlreadyHeld", err)
	}
}

func TestUnlockNotHeld(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	m := newSession(t, c).NewMutex("invoices")
	if err := m.Unlock(t.Context()); !errors.Is(err, lockd.ErrNotHeld) {
		t.Errorf("Unlock before Lock = %v, want ErrNotHeld", err)
	}
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	held := m.Context()
	if err := m.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if held.Err() == nil {
		t.Error("hold context not cancelled by Unlock")
	}
	if err := context.Cause(held); !errors.Is(err, lockd.ErrNotHeld) {
		t.Errorf("cause %v, want ErrNotHeld", err)
	}
	if err := m.Unlock(t.Context()); !errors.Is(err, lockd.ErrNotHeld) {
		t.Errorf("second Unlock = %v, want ErrNotHeld", err)
	}
	// A release by token that is not a current grant is refused by the server.
	const secret = "test-secret-0123456789abcdef"
	s, err := c.Service().CreateSession(t.Context(), connect.NewRequest(&lockdv1.CreateSessionRequest{Secret: secret}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Service().Release(t.Context(), connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: s.Msg.SessionId, Secret: secret, Seq: 1000, Ack: 1000, Name: "invoices", Token: 1}))
	if !errors.Is(err, lockd.ErrNotHeld) {
		t.Errorf("Release of a stale token = %v, want ErrNotHeld", err)
	}
}

func TestInvalidName(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	s := newSession(t, c)
	for _, name := range []string{"", "bad\x00name", string(make([]byte, 513))} {
		if err := s.NewMutex(name).TryLock(t.Context()); !errors.Is(err, lockd.ErrInvalidArgument) {
			t.Errorf("TryLock(%q) = %v, want ErrInvalidArgument", name, err)
		}
	}
	if err := s.NewSemaphore("reports", 0).TryLock(t.Context()); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Errorf("semaphore of 0 permits: %v, want ErrInvalidArgument", err)
	}
	if err := s.Err(); err != nil {
		t.Errorf("session broken by refused requests: %v", err)
	}
}

func TestSemaphorePermits(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	var sems []*lockd.Semaphore
	tokens := map[uint64]bool{}
	for range 3 {
		sem := newSession(t, c).NewSemaphore("reports", 3)
		if err := sem.TryLock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if tokens[sem.Token()] {
			t.Errorf("token %d granted twice", sem.Token())
		}
		tokens[sem.Token()] = true
		sems = append(sems, sem)
	}
	fourth := newSession(t, c).NewSemaphore("reports", 3)
	if err := fourth.TryLock(t.Context()); !errors.Is(err, lockd.ErrBusy) {
		t.Fatalf("fourth permit: %v, want ErrBusy", err)
	}
	if err := newSession(t, c).NewSemaphore("reports", 5).TryLock(t.Context()); !errors.Is(err, lockd.ErrLimitMismatch) {
		t.Errorf("semaphore of 5 on a lock of 3: %v, want ErrLimitMismatch", err)
	}
	done := make(chan error, 1)
	go func() { done <- fourth.Lock(t.Context()) }()
	waitQueue(t, c, "reports", 1)
	if err := sems[1].Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := len(describe(t, c, "reports").GetHolders()); got != 3 {
		t.Errorf("%d holders, want 3", got)
	}
}

func TestRWMutex(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	r1 := newSession(t, c).NewRWMutex("catalog")
	r2 := newSession(t, c).NewRWMutex("catalog")
	w := newSession(t, c).NewRWMutex("catalog")
	if err := r1.RLock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := r2.TryRLock(t.Context()); err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if err := w.TryLock(t.Context()); !errors.Is(err, lockd.ErrBusy) {
		t.Fatalf("writer while readers hold: %v, want ErrBusy", err)
	}
	if err := r1.Unlock(t.Context()); !errors.Is(err, lockd.ErrNotHeld) {
		t.Errorf("write-Unlock of a read hold: %v, want ErrNotHeld", err)
	}
	// A waiting writer holds back later readers.
	wdone := make(chan error, 1)
	go func() { wdone <- w.Lock(t.Context()) }()
	waitQueue(t, c, "catalog", 1)
	r3 := newSession(t, c).NewRWMutex("catalog")
	if err := r3.TryRLock(t.Context()); !errors.Is(err, lockd.ErrBusy) {
		t.Errorf("reader behind a waiting writer: %v, want ErrBusy", err)
	}
	if err := r1.RUnlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := r2.RUnlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-wdone; err != nil {
		t.Fatal(err)
	}
	if w.Token() == 0 || w.Err() != nil {
		t.Errorf("writer token %d err %v", w.Token(), w.Err())
	}
	if err := w.RUnlock(t.Context()); !errors.Is(err, lockd.ErrNotHeld) {
		t.Errorf("RUnlock of a write hold: %v, want ErrNotHeld", err)
	}
	if err := w.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestLockCancelQueued(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	holder := newSession(t, c).NewMutex("migration")
	if err := holder.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	ws := newSession(t, c)
	waiter := ws.NewMutex("migration")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- waiter.Lock(ctx) }()
	waitQueue(t, c, "migration", 1)
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock after cancel = %v, want context.Canceled", err)
	}
	if waiter.Token() != 0 {
		t.Error("cancelled waiter holds the lock")
	}
	if got := len(describe(t, c, "migration").GetWaiters()); got != 0 {
		t.Errorf("%d waiters left after the cancel, want 0", got)
	}
	if err := holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l := describe(t, c, "migration"); l != nil {
		t.Errorf("lock not free after the holder left: %v", l)
	}
	// The session is still usable.
	if err := waiter.TryLock(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A deadline gives an error matching context.DeadlineExceeded.
	other := newSession(t, c).NewMutex("migration")
	dctx, dcancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer dcancel()
	if err := other.Lock(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock with a deadline = %v, want context.DeadlineExceeded", err)
	}
	if got := len(describe(t, c, "migration").GetWaiters()); got != 0 {
		t.Errorf("%d waiters left after the deadline, want 0", got)
	}
}

func TestSessionCloseReleases(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	s1 := newSession(t, c)
	m1 := s1.NewMutex("webhook/evt_123")
	if err := m1.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := m1.Token()
	m2 := newSession(t, c).NewMutex("webhook/evt_123")
	done := make(chan error, 1)
	go func() { done <- m2.Lock(t.Context()) }()
	waitQueue(t, c, "webhook/evt_123", 1)
	if err := s1.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m1.Done():
	default:
		t.Error("held lock's Done not closed by session Close")
	}
	if err := m1.Err(); !errors.Is(err, lockd.ErrSessionClosed) {
		t.Errorf("Err = %v, want ErrSessionClosed", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m2.Token() <= first {
		t.Errorf("token %d not above %d", m2.Token(), first)
	}
	if err := m1.Lock(t.Context()); !errors.Is(err, lockd.ErrSessionClosed) {
		t.Errorf("Lock on a closed session = %v, want ErrSessionClosed", err)
	}
}

func TestForceReleaseLosesLease(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	s := newSession(t, c, lockd.WithTTL(time.Second))
	m := s.NewMutex("stuck")
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Service().ForceRelease(t.Context(), connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "stuck"})); err != nil {
		t.Fatal(err)
	}
	<-m.Done() // by the next keepalive, or the client deadline
	if err := m.Err(); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Errorf("Err = %v, want ErrLeaseLost", err)
	}
	if err := s.Err(); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Errorf("session Err = %v, want ErrLeaseLost", err)
	}
	if err := m.Unlock(t.Context()); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Errorf("Unlock after lease loss = %v, want ErrLeaseLost", err)
	}
	// The lock comes back to others.
	other := newSession(t, c).NewMutex("stuck")
	if err := other.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestHoldSurvivesServerRestart(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	s := newSession(t, c, lockd.WithTTL(5*time.Second))
	m := s.NewMutex("invoices")
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	// The client retries through the restart.
	other := newSession(t, c).NewMutex("invoices")
	if err := other.TryLock(t.Context()); !errors.Is(err, lockd.ErrBusy) {
		t.Fatalf("TryLock after restart = %v, want ErrBusy", err)
	}
	if err := m.Err(); err != nil {
		t.Fatalf("hold lost in a restart: %v", err)
	}
	held := m.Token()
	if err := m.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := other.TryLock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if other.Token() <= held {
		t.Errorf("token after restart %d not above %d", other.Token(), held)
	}
}
