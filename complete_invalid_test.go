package lockd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// A Complete refused as invalid (retention below 1 s) leaves the hold in
// place on both sides, so the caller can still Unlock it.
func TestCompleteInvalidRetentionKeepsHold(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	ctx := t.Context()
	s := newSession(t, c)
	m := s.NewMutex("job")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Complete(ctx, 500*time.Millisecond); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("Complete with 500ms: %v, want ErrInvalidArgument", err)
	}
	if m.Err() != nil || m.Token() == 0 {
		t.Fatalf("hold dropped by a refused Complete: err %v token %d", m.Err(), m.Token())
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock after a refused Complete: %v", err)
	}
	if l := describe(t, c, "job"); l != nil {
		t.Fatalf("lock still held on the server: %v", l)
	}
}
