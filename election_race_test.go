package lockd_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// A second Campaign while the first is still queued is refused, and the
// first, when it wins, is a leadership the Election knows and can resign.
func TestElectionConcurrentCampaign(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	ctx := t.Context()
	holder := newSession(t, c).NewMutex("leader")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, c)
	e := s.NewElection("leader")
	first := make(chan error, 1)
	go func() { first <- e.Campaign(ctx, []byte("a")) }()
	waitQueue(t, c, "leader", 1)
	if err := e.Campaign(ctx, []byte("b")); !errors.Is(err, lockd.ErrAlreadyHeld) {
		t.Fatalf("second Campaign: %v, want ErrAlreadyHeld", err)
	}
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first Campaign: %v", err)
	}
	if l, err := e.Leader(ctx); err != nil || l.SessionID != s.ID() || e.Err() != nil || e.Token() == 0 {
		t.Fatalf("after winning: leader %+v %v, e.Err %v, token %d", l, err, e.Err(), e.Token())
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
}
