package lockd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/lease"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

func TestLeaseConfirm(t *testing.T) {
	const ttl = 3 * time.Second
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	l := clientLease{sent: t0, deadline: lease.ClientDeadline(t0, ttl)}

	// A newer confirmation moves the deadline.
	if !l.confirm(at(time.Second), ttl, at(1100*time.Millisecond)) {
		t.Fatal("confirmation of a newer keepalive did not move the deadline")
	}
	if got, want := l.deadline, lease.ClientDeadline(at(time.Second), ttl); !got.Equal(want) {
		t.Errorf("deadline %v, want %v", got, want)
	}
	// A late reply to an older keepalive never moves it back.
	if l.confirm(at(500*time.Millisecond), ttl, at(1200*time.Millisecond)) {
		t.Error("reply to an older keepalive moved the deadline")
	}
	if got, want := l.deadline, lease.ClientDeadline(at(time.Second), ttl); !got.Equal(want) {
		t.Errorf("deadline moved back to %v, want %v", got, want)
	}
	// An older keepalive confirmed with a longer TTL may move it later,
	// never earlier.
	if !l.confirm(at(900*time.Millisecond), 2*ttl, at(1300*time.Millisecond)) {
		t.Error("longer grant of an older keepalive did not move the deadline")
	}
	// A confirmation arriving at the deadline does not revive the lease.
	dl := l.deadline
	if l.confirm(dl.Add(-time.Millisecond), ttl, dl) {
		t.Error("confirmation at the deadline moved it")
	}
	if !l.lost {
		t.Error("lease not lost at its deadline")
	}
	if l.confirm(dl.Add(time.Second), ttl, dl.Add(time.Second)) || !l.lost {
		t.Error("a lost lease was revived")
	}
}

// deadlines records the calls of a WithDeadlineFunc.
type deadlines struct {
	mu  sync.Mutex
	got []time.Time
}

func (d *deadlines) record(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, t)
}

func (d *deadlines) all() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.got...)
}

func TestSessionKeepsAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		tr := &transport{keepAlive: okKeepAlive(ttl)}
		c := newTestClient(t, []*transport{tr})
		var dls deadlines
		start := time.Now()
		s, err := c.NewSession(t.Context(), WithTTL(ttl), WithOwner("billing-1"), WithDeadlineFunc(dls.record))
		if err != nil {
			t.Fatal(err)
		}
		if s.TTL() != ttl || s.ID() != "s1" {
			t.Errorf("session %s ttl %v", s.ID(), s.TTL())
		}
		create := tr.callsOf("CreateSession")[0].msg.(*lockdv1.CreateSessionRequest)
		if create.GetOwner() != "billing-1" || len(create.GetRequestId()) != 32 || create.GetTtl().AsDuration() != ttl {
			t.Errorf("create request %v", create)
		}
		time.Sleep(10*time.Second + time.Millisecond)
		if err := s.Err(); err != nil {
			t.Fatalf("session lost: %v", err)
		}
		kas := tr.callsOf("KeepAlive")
		if len(kas) != 10 {
			t.Errorf("%d keepalives in 10s with TTL 3s, want 10", len(kas))
		}
		for i, ka := range kas {
			if want := start.Add(time.Duration(i+1) * time.Second); !ka.at.Equal(want) {
				t.Errorf("keepalive %d at %v, want %v", i, ka.at.Sub(start), want.Sub(start))
			}
		}
		if got, want := s.Deadline(), lease.ClientDeadline(kas[len(kas)-1].at, ttl); !got.Equal(want) {
			t.Errorf("deadline %v, want %v", got.Sub(start), want.Sub(start))
		}
		got := dls.all()
		if len(got) != 11 {
			t.Errorf("deadline func called %d times, want 11 (create + 10 keepalives)", len(got))
		}
		for i := 1; i < len(got); i++ {
			if !got[i].After(got[i-1]) {
				t.Errorf("deadline %d (%v) not after %d (%v)", i, got[i], i-1, got[i-1])
			}
		}
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := s.Err(); !errors.Is(err, ErrSessionClosed) {
			t.Errorf("Err after Close = %v, want ErrSessionClosed", err)
		}
		select {
		case <-s.Done():
		default:
			t.Error("Done not closed after Close")
		}
		closes := tr.callsOf("CloseSession")
		if len(closes) != 1 || closes[0].msg.(*lockdv1.CloseSessionRequest).GetSeq() != 1 {
			t.Errorf("close calls %v", closes)
		}
		n := len(tr.callsOf("KeepAlive"))
		time.Sleep(10 * time.Second)
		if len(tr.callsOf("KeepAlive")) != n {
			t.Error("keepalives after Close")
		}
		if err := s.Close(t.Context()); err != nil {
			t.Errorf("second Close = %v", err)
		}
	})
}

// TestSessionLostBeforeServer freezes the server: the client must give up
// its lease before the server could expire it (acceptance 4).
func TestSessionLostBeforeServer(t *testing.T) {
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 10 * time.Second} {
		t.Run(ttl.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				frozen := false
				var lastReceived time.Time
				tr := &transport{keepAlive: func(ctx context.Context, _ *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
					mu.Lock()
					f := frozen
					if !f {
						lastReceived = time.Now()
					}
					mu.Unlock()
					if f {
						<-ctx.Done() // SIGSTOPped: never answers
						return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
					}
					return okKeepAlive(ttl)(ctx, nil)
				}}
				c := newTestClient(t, []*transport{tr})
				s, err := c.NewSession(t.Context(), WithTTL(ttl))
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(ttl + ttl/2)
				mu.Lock()
				frozen = true
				mu.Unlock()
				<-s.Done()
				lost := time.Now()
				mu.Lock()
				serverDeadline := lastReceived.Add(ttl) // plus grace, in reality
				want := lease.ClientDeadline(lastReceived, ttl)
				mu.Unlock()
				if !lost.Equal(want) {
					t.Errorf("lost at %v after the last confirmed keepalive, want %v", lost.Sub(lastReceived), want.Sub(lastReceived))
				}
				if !lost.Before(serverDeadline) {
					t.Errorf("lost at %v, not before the server deadline %v", lost, serverDeadline)
				}
				if err := s.Err(); !errors.Is(err, ErrLeaseLost) {
					t.Errorf("Err = %v, want ErrLeaseLost", err)
				}
				if err := context.Cause(s.Context()); !errors.Is(err, ErrLeaseLost) {
					t.Errorf("context cause = %v, want ErrLeaseLost", err)
				}
				// The client tries to close the session; the server does not
				// answer, so it gives up within the request timeout.
				synctest.Wait()
				if err := s.Close(t.Context()); err != nil {
					t.Errorf("Close of a lost session = %v, want nil", err)
				}
				if got := len(tr.callsOf("CloseSession")); got == 0 {
					t.Error("no CloseSession after lease loss")
				}
			})
		})
	}
}

func TestSessionNotFoundLosesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		tr := &transport{keepAlive: func(context.Context, *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
			return nil, apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
		}}
		c := newTestClient(t, []*transport{tr})
		start := time.Now()
		s, err := c.NewSession(t.Context(), WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		<-s.Done()
		if got := time.Since(start); got != ttl/3 {
			t.Errorf("lost after %v, want at the first keepalive (%v)", got, ttl/3)
		}
		if err := s.Err(); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Err = %v, want ErrLeaseLost", err)
		}
		if got := len(tr.callsOf("KeepAlive")); got != 1 {
			t.Errorf("%d keepalives, want 1", got)
		}
		synctest.Wait()
		if got := len(tr.callsOf("CloseSession")); got != 1 {
			t.Errorf("%d CloseSession calls after loss, want 1", got)
		}
		// A lost session refuses new work.
		if err := s.NewMutex("m").Lock(t.Context()); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Lock on a lost session = %v, want ErrLeaseLost", err)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// TestSessionJeopardy: while keepalives fail, they are retried every TTL/10,
// and a short outage (a leader election) does not lose the lease.
func TestSessionJeopardy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		start := time.Now()
		tr := &transport{keepAlive: func(ctx context.Context, r *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
			if e := time.Since(start); e >= time.Second && e < 2500*time.Millisecond {
				return nil, apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER)
			}
			return okKeepAlive(ttl)(ctx, r)
		}}
		c := newTestClient(t, []*transport{tr})
		s, err := c.NewSession(t.Context(), WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		if err := s.Err(); err != nil {
			t.Fatalf("lease lost in a 1.5s outage with TTL 3s: %v", err)
		}
		var got []time.Duration
		for _, ka := range tr.callsOf("KeepAlive") {
			got = append(got, ka.at.Sub(start))
		}
		ms := time.Millisecond
		want := []time.Duration{1000 * ms, 1300 * ms, 1600 * ms, 1900 * ms, 2200 * ms, 2500 * ms}
		if len(got) < len(want) {
			t.Fatalf("keepalives at %v, want %v first", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("keepalives at %v, want %v first", got, want)
			}
		}
		if dl, want := s.Deadline(), lease.ClientDeadline(start.Add(2500*ms), ttl); !dl.Equal(want) {
			t.Errorf("deadline %v, want %v", dl.Sub(start), want.Sub(start))
		}
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSessionSlowReply: a keepalive confirmed late counts from when it was
// sent, and an endpoint that hangs is abandoned for another in time.
func TestSessionHungEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 4 * time.Second
		hung := &transport{keepAlive: func(ctx context.Context, _ *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
			<-ctx.Done()
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}}
		ok := &transport{keepAlive: okKeepAlive(ttl)}
		c := newTestClient(t, []*transport{hung, ok})
		start := time.Now()
		s, err := c.NewSession(t.Context(), WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		kas := ok.callsOf("KeepAlive")
		if len(kas) == 0 {
			t.Fatal("no keepalive reached the live endpoint")
		}
		// The first keepalive went to the hung endpoint at TTL/3; with no
		// answer after TTL/4 the client abandoned that endpoint and sent
		// the keepalive again to the other at once (abandon.go).
		if got, want := kas[0].at.Sub(start), ttl/3+ttl/4; got != want {
			t.Errorf("first keepalive on the live endpoint after %v, want %v", got, want)
		}
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestClientCloseClosesSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &transport{keepAlive: okKeepAlive(DefaultTTL)}
		c := newTestClient(t, []*transport{tr})
		s1, err := c.NewSession(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		s2, err := c.NewSession(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, s := range []*Session{s1, s2} {
			if err := s.Err(); !errors.Is(err, ErrSessionClosed) {
				t.Errorf("Err = %v, want ErrSessionClosed", err)
			}
		}
		if got := len(tr.callsOf("CloseSession")); got != 2 {
			t.Errorf("%d CloseSession calls, want 2", got)
		}
		if _, err := c.NewSession(t.Context()); !errors.Is(err, ErrClosed) {
			t.Errorf("NewSession after Close = %v, want ErrClosed", err)
		}
	})
}

// A closed session is closed on the server: Close runs after the client
// saw its lease lost but before the keepalive loop acted on the loss (here
// the loop is still inside a KeepAlive call that ignores its cancellation,
// as a stalled goroutine would), and still sends CloseSession, so the
// server drops the session's waits now instead of at its own deadline. The
// endpoint is the scripted transport: only a synctest bubble makes the
// ordering of the two goroutines deterministic, and real sockets cannot
// enter one.
func TestSessionCloseAfterLossTellsServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 2 * time.Second
		stalled := make(chan struct{})
		var mu sync.Mutex
		n := 0
		tr := &transport{keepAlive: func(ctx context.Context, r *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
			mu.Lock()
			n++
			first := n == 1
			mu.Unlock()
			if first {
				<-stalled // past the lease deadline, whatever ctx says
			}
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
		}}
		c := newTestClient(t, []*transport{tr})
		s, err := c.NewSession(t.Context(), WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		<-s.Done() // the deadline timer saw the lease lost
		if !errors.Is(s.Err(), ErrLeaseLost) {
			t.Fatalf("session err %v, want ErrLeaseLost", s.Err())
		}
		closed := make(chan error, 1)
		go func() { closed <- s.Close(context.Background()) }()
		synctest.Wait() // Close waits for the stalled keepalive loop
		close(stalled)
		if err := <-closed; err != nil {
			t.Fatalf("Close of a lost session: %v, want nil", err)
		}
		if got := len(tr.callsOf("CloseSession")); got != 1 {
			t.Errorf("CloseSession sent %d times, want once", got)
		}
	})
}
