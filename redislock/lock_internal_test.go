package redislock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lockd-dev/lockd"
)

func TestHoldDeadline(t *testing.T) {
	sent := time.Unix(1000, 0)
	for _, tc := range []struct {
		ttl, want time.Duration
	}{
		// sent + TTL·0.99 − max(100 ms, 2 % TTL); always before the Redlock
		// validity end sent + TTL − (TTL·1 % + 2 ms).
		{250 * time.Millisecond, 147500 * time.Microsecond},
		{time.Second, 890 * time.Millisecond},
		{5 * time.Second, 4850 * time.Millisecond},
		{10 * time.Second, 9700 * time.Millisecond},
		{time.Hour, 3492 * time.Second},
	} {
		got := holdDeadline(sent, tc.ttl).Sub(sent)
		if got != tc.want {
			t.Errorf("holdDeadline(ttl %v): got sent+%v, want sent+%v", tc.ttl, got, tc.want)
		}
		if validity := tc.ttl - drift(tc.ttl); got >= validity {
			t.Errorf("ttl %v: deadline sent+%v not before the validity end sent+%v", tc.ttl, got, validity)
		}
	}
}

// fakeStore is a store whose answers the test scripts; it runs inside a
// synctest bubble, so its delays cost no real time.
type fakeStore struct {
	mu       sync.Mutex
	busy     bool
	hint     time.Duration
	extendFn func(ctx context.Context) error
	extends  []time.Time
	released int
}

func (f *fakeStore) channel() string { return "" }

func (f *fakeStore) acquire(context.Context, string) (bool, uint64, time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.busy {
		return false, 0, f.hint, nil
	}
	return true, 42, 0, nil
}

func (f *fakeStore) extend(ctx context.Context, _ string) error {
	f.mu.Lock()
	f.extends = append(f.extends, time.Now())
	fn := f.extendFn
	f.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn(ctx)
}

func (f *fakeStore) release(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released++
	return nil
}

func fakeMutex(ttl time.Duration, st store) *Mutex {
	b := newBackend(config{ttl: ttl, timeout: time.Second, logger: slog.New(slog.DiscardHandler)})
	return &Mutex{l: newLock(b, "fake", st)}
}

// lockAt takes m and returns the time of the grant (in the bubble's clock).
func lockAt(t *testing.T, m *Mutex) time.Time {
	t.Helper()
	start := time.Now()
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	return start
}

// firedAt waits for Done and returns the bubble's time then.
func firedAt(t *testing.T, m *Mutex, limit time.Duration) time.Time {
	t.Helper()
	select {
	case <-m.Done():
		return time.Now()
	case <-time.After(limit):
		t.Fatalf("Done not closed within %v", limit)
		return time.Time{}
	}
}

// TestWatchdogRenews: a hold is renewed every TTL/3 and kept for as long
// as renewals succeed.
func TestWatchdogRenews(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		st := &fakeStore{}
		m := fakeMutex(ttl, st)
		t0 := lockAt(t, m)
		time.Sleep(10*time.Second + time.Millisecond)
		if err := m.Err(); err != nil {
			t.Fatalf("hold lost while renewals succeed: %v", err)
		}
		st.mu.Lock()
		for i, at := range st.extends {
			if want := t0.Add(time.Duration(i+1) * ttl / 3); !at.Equal(want) {
				t.Errorf("renewal %d at t0+%v, want t0+%v", i, at.Sub(t0), want.Sub(t0))
			}
		}
		if n := len(st.extends); n != 10 {
			t.Errorf("renewals in 10 s: got %d, want 10", n)
		}
		st.mu.Unlock()
		if got, want := m.Deadline(), holdDeadline(t0.Add(10*time.Second), ttl); !got.Equal(want) {
			t.Errorf("deadline after the last renewal: got t0+%v, want t0+%v", got.Sub(t0), want.Sub(t0))
		}
		if err := m.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(m.Err(), lockd.ErrNotHeld) {
			t.Errorf("Err after Unlock: got %v, want ErrNotHeld", m.Err())
		}
	})
}

// TestWatchdogDeadline: when renewals fail, hang, or are confirmed too
// late, the lease-loss context is cancelled exactly at the client deadline
// of the last confirmed request; when a renewal finds the key gone, at
// once.
func TestWatchdogDeadline(t *testing.T) {
	const ttl = time.Second
	for _, tc := range []struct {
		name   string
		extend func(ctx context.Context) error
		at     time.Duration // after the grant
	}{
		{"failing", func(context.Context) error { return unavailable(errors.New("connection refused")) }, 890 * time.Millisecond},
		{"hanging", func(ctx context.Context) error { <-ctx.Done(); return unavailable(ctx.Err()) }, 890 * time.Millisecond},
		{"late", func(context.Context) error { time.Sleep(700 * time.Millisecond); return nil }, 890 * time.Millisecond},
		{"gone", func(context.Context) error { return errGone }, ttl / 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &fakeStore{extendFn: tc.extend}
				m := fakeMutex(ttl, st)
				t0 := lockAt(t, m)
				if got := firedAt(t, m, 5*time.Second).Sub(t0); got != tc.at {
					t.Errorf("lease-loss context cancelled at t0+%v, want t0+%v", got, tc.at)
				}
				if !errors.Is(m.Err(), lockd.ErrLeaseLost) || !errors.Is(context.Cause(m.Context()), lockd.ErrLeaseLost) {
					t.Errorf("Err: got %v, want ErrLeaseLost", m.Err())
				}
				time.Sleep(2 * ttl) // a late confirmation must not revive the hold
				if !errors.Is(m.Err(), lockd.ErrLeaseLost) {
					t.Errorf("Err later: got %v, want ErrLeaseLost", m.Err())
				}
				if err := m.Unlock(t.Context()); !errors.Is(err, lockd.ErrLeaseLost) {
					t.Errorf("Unlock of a lost hold: got %v, want ErrLeaseLost", err)
				}
				if st.released != 1 {
					t.Errorf("compare-and-deletes at Unlock: got %d, want 1", st.released)
				}
			})
		})
	}
}

// TestLockWaits: Lock retries a busy lock until its context ends, then
// returns both causes; TryLock does not wait; a second Lock on a held
// handle is refused.
func TestLockWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeStore{busy: true, hint: 300 * time.Millisecond}
		m := fakeMutex(time.Second, st)
		if err := m.TryLock(t.Context()); !errors.Is(err, lockd.ErrBusy) {
			t.Errorf("TryLock busy: got %v, want ErrBusy", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := m.Lock(ctx)
		if !errors.Is(err, lockd.ErrBusy) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock until deadline: got %v, want ErrBusy and DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("Lock returned after %v, want exactly at the 2s deadline", d)
		}
		// A waiter gets the lock once it is free.
		go func() {
			time.Sleep(500 * time.Millisecond)
			st.mu.Lock()
			st.busy = false
			st.mu.Unlock()
		}()
		start = time.Now()
		if err := m.Lock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 500*time.Millisecond || d > 800*time.Millisecond {
			t.Errorf("Lock granted after %v, want within the 300 ms hint of the release at 500 ms", d)
		}
		if err := m.Lock(t.Context()); !errors.Is(err, lockd.ErrAlreadyHeld) {
			t.Errorf("second Lock: got %v, want ErrAlreadyHeld", err)
		}
		if m.Token() != 42 {
			t.Errorf("Token: got %d, want 42", m.Token())
		}
		if err := m.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(t.Context()); !errors.Is(err, lockd.ErrNotHeld) {
			t.Errorf("second Unlock: got %v, want ErrNotHeld", err)
		}
	})
}
