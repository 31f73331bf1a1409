package lockd_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// A node that stops answering (frozen, not dead: its connections stay
// open) under a queued Acquire: the client's keepalive to it goes
// unanswered, the client abandons the node and re-sends the Acquire with
// its seq through the other endpoint, where it gets the grant made while
// it was away — one grant, within about the keepalive attempt timeout
// (TTL/4) rather than the long poll's 25 s or the whole freeze. Over the
// session stream and over unary HTTP/1.1.
func TestFrozenNodeAcquireMovesOn(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := "stream"
		if !stream {
			name = "unary"
		}
		t.Run(name, func(t *testing.T) {
			srv := lockdtest.New(t)
			direct := newClient(t, srv)
			// Two ways to the one node: freezing the one the client uses
			// leaves the other, as a frozen leader leaves the next node.
			a, b := newFaultProxy(t, srv.Addr().String()), newFaultProxy(t, srv.Addr().String())
			c := newClient(t, srv, lockd.WithEndpoints(a.URL(), b.URL()), lockd.WithStream(stream))
			holder := newSession(t, direct)
			const ttl = 2 * time.Second
			waiter := newSession(t, c, lockd.WithTTL(ttl))
			mh, mw := holder.NewMutex("payroll"), waiter.NewMutex("payroll")
			if err := mh.Lock(t.Context()); err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() { got <- mw.Lock(t.Context()) }()
			waitQueue(t, direct, "payroll", 1)
			used := a
			if !a.used() {
				used = b
			}
			if a.used() && b.used() {
				t.Fatal("the client used both endpoints before any fault")
			}
			used.freeze()
			frozeAt := time.Now()
			// The grant is made now, on the node; the waiter can learn it
			// only through the endpoint that still answers.
			if err := mh.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("Lock after its node froze = %v", err)
				}
			case <-time.After(ttl + 2*time.Second): // generous: about TTL/3 + TTL/4 is expected
				t.Fatalf("the queued Lock still waits on the frozen endpoint %v after the freeze", ttl+2*time.Second)
			}
			t.Logf("moved on %v after the freeze", time.Since(frozeAt).Round(time.Millisecond))
			if waiter.Err() != nil {
				t.Fatalf("session lost: %v", waiter.Err())
			}
			l := describe(t, direct, "payroll")
			if len(l.GetHolders()) != 1 || l.GetHolders()[0].GetSessionId() != waiter.ID() || l.GetHolders()[0].GetToken() != mw.Token() || len(l.GetWaiters()) != 0 {
				t.Fatalf("lock %v, want one hold by %s with token %d and no waiter", l, waiter.ID(), mw.Token())
			}
			if err := mw.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// signalHandler is a slog.Handler that closes a channel at the first
// record with the given message.
type signalHandler struct {
	msg  string
	once *sync.Once
	ch   chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.ch) })
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// A queued Lock whose cluster stops answering for longer than the retry
// timeout, while its session lives (a short outage, well within the TTL),
// waits on with the same request and keeps its place in the queue: it
// neither returns ErrUnavailable (which made `lockd run` queue anew at
// the back, or exit when the repeat met its own first wait as "already
// held") nor lets the waiter queued behind it overtake. The outage is a
// frozen proxy in front of the one node (faultProxy), over the session
// stream.
func TestLockWaitKeepsPlaceThroughOutage(t *testing.T) {
	srv := lockdtest.New(t)
	direct := newClient(t, srv)
	p := newFaultProxy(t, srv.Addr().String())
	waiting := make(chan struct{})
	log := slog.New(signalHandler{msg: "lock wait: cluster unavailable, still waiting", once: new(sync.Once), ch: waiting})
	c := newClient(t, srv, lockd.WithEndpoints(p.URL()), lockd.WithStream(true),
		lockd.WithRetryTimeout(300*time.Millisecond), lockd.WithLogger(log))
	holder, second := newSession(t, direct), newSession(t, direct)
	waiter := newSession(t, c, lockd.WithTTL(20*time.Second))
	mh, mw, m2 := holder.NewMutex("ledger"), waiter.NewMutex("ledger"), second.NewMutex("ledger")
	if err := mh.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- mw.Lock(t.Context()) }()
	waitQueue(t, direct, "ledger", 1)
	got2 := make(chan error, 1)
	go func() { got2 <- m2.Lock(t.Context()) }()
	waitQueue(t, direct, "ledger", 2)

	p.freeze()
	select {
	case err := <-got:
		t.Fatalf("the queued Lock ended during a short outage with its session alive: %v", err)
	case <-waiting: // its attempt gave up, and the wait goes on
	case <-time.After(15 * time.Second): // generous: pings find the frozen connection in about 2 s
		t.Fatal("no sign of the outage reaching the queued Lock within 15 s")
	}
	p.thaw()
	if err := mh.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Lock after the outage = %v", err)
		}
	case err := <-got2:
		t.Fatalf("the waiter queued second got the lock first (err %v)", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first waiter got no grant within 30 s of the outage's end")
	}
	if waiter.Err() != nil {
		t.Fatalf("session lost: %v", waiter.Err())
	}
	l := describe(t, direct, "ledger")
	if len(l.GetHolders()) != 1 || l.GetHolders()[0].GetSessionId() != waiter.ID() || len(l.GetWaiters()) != 1 || l.GetWaiters()[0].GetSessionId() != second.ID() {
		t.Fatalf("lock %v, want the first waiter holding and the second still queued", l)
	}
	if err := mw.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got2; err != nil {
		t.Fatalf("second waiter: %v", err)
	}
}
