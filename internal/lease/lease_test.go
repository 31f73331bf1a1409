package lease

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder collects expiry callbacks with the (fake) time they fired.
type recorder struct {
	mu    sync.Mutex
	fired map[string]time.Time
}

func newRecorder() *recorder { return &recorder{fired: map[string]time.Time{}} }

func (r *recorder) expire(id string, _ uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fired[id] = time.Now()
}

func (r *recorder) get(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.fired[id]
	return t, ok
}

const grace = 500 * time.Millisecond

func TestInactiveManagerRefusesAndExpiresNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		m := New(grace, r.expire)
		m.Created("a", time.Second)
		if _, err := m.KeepAlive("a", time.Now()); !errors.Is(err, ErrNotActive) {
			t.Fatalf("keepalive on inactive manager: got %v, want ErrNotActive", err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if _, ok := r.get("a"); ok {
			t.Fatal("inactive manager expired a session")
		}
	})
}

func TestPromoteRestartsLeasesInFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		m := New(grace, r.expire)
		start := time.Now()
		m.Promote(1, []Entry{{ID: "a", TTL: time.Second}, {ID: "b", TTL: 3 * time.Second}})
		time.Sleep(time.Second + grace - time.Millisecond)
		synctest.Wait()
		if _, ok := r.get("a"); ok {
			t.Fatal("a expired before TTL + grace")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if at, ok := r.get("a"); !ok || at.Sub(start) != time.Second+grace {
			t.Fatalf("a: fired=%v at %v, want at TTL+grace %v", ok, at.Sub(start), time.Second+grace)
		}
		if _, err := m.KeepAlive("a", time.Now()); !errors.Is(err, ErrExpiring) {
			t.Fatalf("keepalive after expiry decision: got %v, want ErrExpiring (never revived)", err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if at, ok := r.get("b"); !ok || at.Sub(start) != 3*time.Second+grace {
			t.Fatalf("b: fired=%v at %v", ok, at.Sub(start))
		}
	})
}

func TestKeepAliveMovesDeadlineFromReceiveTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		m := New(grace, r.expire)
		start := time.Now()
		m.Promote(1, nil)
		m.Created("a", time.Second)
		for i := 0; i < 10; i++ {
			time.Sleep(400 * time.Millisecond)
			received := time.Now()
			time.Sleep(50 * time.Millisecond) // verification delay
			ttl, err := m.KeepAlive("a", received)
			if err != nil || ttl != time.Second {
				t.Fatalf("keepalive %d: %v %v", i, ttl, err)
			}
		}
		last := start.Add(10*450*time.Millisecond - 50*time.Millisecond)
		// An older request's receive time never moves the deadline back.
		if _, err := m.KeepAlive("a", start); err != nil {
			t.Fatal(err)
		}
		if d, _ := m.Deadline("a"); !d.Equal(last.Add(time.Second + grace)) {
			t.Fatalf("deadline %v after start, want %v", d.Sub(start), last.Add(time.Second+grace).Sub(start))
		}
		time.Sleep(time.Until(last.Add(time.Second+grace)) - time.Millisecond)
		synctest.Wait()
		if _, ok := r.get("a"); ok {
			t.Fatal("expired before receive + TTL + grace")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if _, ok := r.get("a"); !ok {
			t.Fatal("not expired at receive + TTL + grace")
		}
	})
}

func TestDemoteClearsTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		m := New(grace, r.expire)
		m.Promote(1, []Entry{{ID: "a", TTL: time.Second}})
		time.Sleep(time.Second)
		m.Demote()
		if _, err := m.KeepAlive("a", time.Now()); !errors.Is(err, ErrNotActive) {
			t.Fatalf("keepalive after demote: got %v", err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if _, ok := r.get("a"); ok {
			t.Fatal("a demoted manager expired a session")
		}
		// A new term starts the lease over in full.
		promoted := time.Now()
		m.Promote(1, []Entry{{ID: "a", TTL: time.Second}})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if at, ok := r.get("a"); !ok || at.Sub(promoted) != time.Second+grace {
			t.Fatalf("after re-promote: fired=%v at %v", ok, at.Sub(promoted))
		}
	})
}

func TestRevokedRefusesKeepAliveAndExpiresAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		m := New(grace, r.expire)
		start := time.Now()
		m.Promote(1, []Entry{{ID: "a", TTL: time.Second}, {ID: "b", TTL: time.Second, Revoked: true}})
		m.Revoked("a")
		for _, id := range []string{"a", "b"} {
			if _, err := m.KeepAlive(id, time.Now()); !errors.Is(err, ErrRevoked) {
				t.Fatalf("%s: got %v, want ErrRevoked", id, err)
			}
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for _, id := range []string{"a", "b"} {
			if at, ok := r.get(id); !ok || at.Sub(start) != time.Second+grace {
				t.Fatalf("%s: fired=%v at %v, want at TTL+grace", id, ok, at.Sub(start))
			}
		}
	})
}

func TestRetryAndRemoved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		calls := 0
		var m *Manager
		m = New(grace, func(id string, _ uint64) {
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if first {
				m.Retry(id, time.Second) // the proposal failed once
			}
		})
		m.Promote(1, []Entry{{ID: "a", TTL: time.Second}, {ID: "gone", TTL: time.Second}})
		m.Removed("gone")
		if _, err := m.KeepAlive("gone", time.Now()); !errors.Is(err, ErrUnknown) {
			t.Fatalf("removed session: got %v, want ErrUnknown", err)
		}
		time.Sleep(time.Second + grace)
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if calls != 2 {
			t.Fatalf("expire called %d times, want 2 (first attempt and retry; never for the removed session)", calls)
		}
	})
}

// TestExpiryDecisionIsFinal: once the manager has decided to expire a
// session, no KeepAlive of that term revives it, also while a failed expiry
// proposal waits for its retry; the retry fires at its delay, not at a
// deadline a KeepAlive moved.
func TestExpiryDecisionIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var calls []time.Time
		var m *Manager
		m = New(grace, func(id string, _ uint64) {
			mu.Lock()
			calls = append(calls, time.Now())
			first := len(calls) == 1
			mu.Unlock()
			if first {
				m.Retry(id, time.Second) // the expiry proposal failed
			}
		})
		start := time.Now()
		m.Promote(1, []Entry{{ID: "a", TTL: time.Second}})
		time.Sleep(time.Second + grace)
		synctest.Wait()
		// Between the failed proposal and its retry.
		time.Sleep(100 * time.Millisecond)
		if _, err := m.KeepAlive("a", time.Now()); !errors.Is(err, ErrExpiring) {
			t.Fatalf("keepalive while the expiry is retried: got %v, want ErrExpiring", err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(calls) != 2 {
			t.Fatalf("expire called %d times, want 2 (the decision and its retry)", len(calls))
		}
		if got, want := calls[1].Sub(start), 2*time.Second+grace; got != want {
			t.Fatalf("retry at %v, want %v (the retry delay after the decision)", got, want)
		}
	})
}
