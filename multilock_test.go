package lockd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// TestMultiLockAndMaxHoldOptions: bad sets and budgets are refused before
// anything is sent (ErrInvalidArgument); a good set is taken and released
// whole against a real server, with one token per lock and a hold context
// that ends at the budget's client deadline.
func TestMultiLockAndMaxHoldOptions(t *testing.T) {
	srv := lockdtest.New(t)
	c, err := lockd.New(lockd.WithEndpoints(srv.URL()), lockd.WithStream(lockdtest.Stream()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*lockd.MultiLock{
		"one lock":      s.NewMultiLock([]string{"a"}),
		"a name twice":  s.NewMultiLock([]string{"a", "a"}),
		"lock-delay":    s.NewMultiLock([]string{"a", "b"}, lockd.WithLockDelay(time.Second)),
		"short budget":  s.NewMultiLock([]string{"a", "b"}, lockd.WithMaxHold(500*time.Millisecond)),
		"budget > 720h": s.NewMultiLock([]string{"a", "b"}, lockd.WithMaxHold(721*time.Hour)),
	} {
		if err := m.TryLock(ctx); !errors.Is(err, lockd.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if err := s.NewMutex("x", lockd.WithMaxHold(time.Millisecond)).TryLock(ctx); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Errorf("mutex with a 1ms budget: %v", err)
	}
	m := s.NewMultiLock([]string{"b", "a"}, lockd.WithMaxHold(time.Minute))
	sent := time.Now()
	if err := m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	toks := m.Tokens()
	if len(toks) != 2 || toks["a"] == 0 || toks["b"] == 0 || toks["a"] == toks["b"] {
		t.Fatalf("tokens %v", toks)
	}
	if dl, ok := m.Context().Deadline(); !ok || dl.After(sent.Add(time.Minute)) {
		t.Fatalf("set's hold deadline %v %v, want before sent+1m", dl, ok)
	}
	if err := m.TryLock(ctx); !errors.Is(err, lockd.ErrAlreadyHeld) {
		t.Fatalf("second TryLock of a held set: %v", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Context().Err() == nil || m.Tokens() != nil {
		t.Fatal("the set still looks held after Unlock")
	}
	if err := m.Unlock(ctx); !errors.Is(err, lockd.ErrNotHeld) {
		t.Fatalf("Unlock of a released set: %v", err)
	}
}
