package lockd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// TestElection: leadership goes to the first candidate, passes in campaign
// order on Resign and on lease end, and everyone sees the leader's value.
func TestElection(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	ctx := t.Context()
	s1, s2, s3 := newSession(t, c), newSession(t, c), newSession(t, c)
	e1, e2, watcher := s1.NewElection("election/billing"), s2.NewElection("election/billing"), s3.NewElection("election/billing")

	if _, err := watcher.Leader(ctx); !errors.Is(err, lockd.ErrNoLeader) {
		t.Fatalf("leader before any campaign: %v, want ErrNoLeader", err)
	}
	if err := e1.Campaign(ctx, []byte("worker-1")); err != nil {
		t.Fatal(err)
	}
	l, err := watcher.Leader(ctx)
	if err != nil || l.SessionID != s1.ID() || string(l.Value) != "worker-1" || l.Token != e1.Token() || l.Token == 0 {
		t.Fatalf("leader: %+v %v, want s1 announcing worker-1 with token %d", l, err, e1.Token())
	}
	if err := e1.Campaign(ctx, nil); !errors.Is(err, lockd.ErrAlreadyHeld) {
		t.Fatalf("second campaign while leading: %v, want ErrAlreadyHeld", err)
	}

	// A bounded campaign while s1 leads gives up and leaves no waiter.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = e2.Campaign(short, []byte("worker-2"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("bounded campaign: %v, want DeadlineExceeded", err)
	}
	if w := describe(t, c, "election/billing").GetWaiters(); len(w) != 0 {
		t.Fatalf("withdrawn campaign left waiters %v", w)
	}

	won := make(chan error, 1)
	go func() { won <- e2.Campaign(ctx, []byte("worker-2")) }()
	waitQueue(t, c, "election/billing", 1)
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatalf("s2 campaign: %v", err)
	}
	if e1.Err() == nil {
		t.Fatal("s1 still leads after resigning")
	}
	if e2.Token() <= l.Token {
		t.Fatalf("new leader's token %d not above %d", e2.Token(), l.Token)
	}
	if l, err := watcher.Leader(ctx); err != nil || l.SessionID != s2.ID() || string(l.Value) != "worker-2" {
		t.Fatalf("leader after resign: %+v %v", l, err)
	}

	// The leader's session ends: its leadership context ends, nobody leads.
	done := e2.Done()
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if _, err := watcher.Leader(ctx); !errors.Is(err, lockd.ErrNoLeader) {
		t.Fatalf("leader after the leader's session closed: %v, want ErrNoLeader", err)
	}
	if err := e1.Resign(ctx); !errors.Is(err, lockd.ErrNotHeld) {
		t.Fatalf("resign when not leading: %v, want ErrNotHeld", err)
	}
}

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
