package lockd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// TestCompleteRunsOnce: the monthly invoice job is done by the first copy;
// a copy that was waiting, one that comes later, and one after a server
// restart all learn "already done" (who, which token) instead of running it
// again; when the retention ends the name is free again.
func TestCompleteRunsOnce(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	ctx := t.Context()
	s1 := newSession(t, c, lockd.WithOwner("web-1"))
	s2 := newSession(t, c, lockd.WithOwner("web-2"))
	s3 := newSession(t, c, lockd.WithOwner("web-3"))

	m1 := s1.NewMutex("invoices/2026-11")
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- s2.NewMutex("invoices/2026-11").Lock(ctx) }()
	waitQueue(t, c, "invoices/2026-11", 1)
	token := m1.Token()
	if err := m1.Complete(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if m1.Err() == nil || m1.Token() != 0 {
		t.Fatal("still held after Complete")
	}
	var done *lockd.DoneError
	if err := <-waited; !errors.As(err, &done) || !errors.Is(err, lockd.ErrAlreadyDone) || done.Token != token || done.Owner != "web-1" {
		t.Fatalf("waiter: %v, want a DoneError by web-1 with token %d", err, token)
	}
	if err := s3.NewMutex("invoices/2026-11").TryLock(ctx); !errors.Is(err, lockd.ErrAlreadyDone) {
		t.Fatalf("later TryLock: %v, want ErrAlreadyDone", err)
	}
	if err := s3.NewMutex("invoices/2026-11").Complete(ctx, time.Hour); !errors.Is(err, lockd.ErrNotHeld) {
		t.Fatalf("Complete without a hold: %v, want ErrNotHeld", err)
	}

	srv.Restart() // the mark is durable
	s4 := newSession(t, newClient(t, srv))
	if err := s4.NewMutex("invoices/2026-11").TryLock(ctx); !errors.Is(err, lockd.ErrAlreadyDone) {
		t.Fatalf("TryLock after restart: %v, want ErrAlreadyDone", err)
	}

	// A short retention ends on the leader's timer; the name is free again.
	m := s4.NewMutex("reports/daily")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	daily := m.Token()
	if err := m.Complete(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond) // the server's real timer: poll with a deadline
	defer tick.Stop()
	next := s4.NewMutex("reports/daily")
	for {
		err := next.TryLock(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, lockd.ErrAlreadyDone) || time.Now().After(deadline) {
			t.Fatalf("after the retention: %v", err)
		}
		<-tick.C
	}
	if next.Token() <= daily {
		t.Fatalf("token after the mark %d not above the completed hold's %d", next.Token(), daily)
	}
	_ = next.Unlock(context.Background())
}

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
