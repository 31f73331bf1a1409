package lockd

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/wire"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

func statusOK(cluster string) func(context.Context, *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error) {
	return func(context.Context, *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error) {
		return &lockdv1.StatusResponse{NodeId: "n", ClusterId: cluster}, nil
	}
}

func failing(err error) func(context.Context, *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error) {
	return func(context.Context, *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error) { return nil, err }
}

func TestRetryRotatesEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := &transport{status: failing(errConnRefused)}
		up := &transport{status: statusOK("c1")}
		c := newTestClient(t, []*transport{down, up})
		start := time.Now()
		if _, err := c.Service().Status(t.Context(), connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
			t.Fatal(err)
		}
		if got := len(down.callsOf("Status")); got != 1 {
			t.Errorf("down endpoint called %d times, want 1", got)
		}
		if got := len(up.callsOf("Status")); got != 1 {
			t.Errorf("up endpoint called %d times, want 1", got)
		}
		if waited := time.Since(start); waited > wire.RetrySchedule.Base {
			t.Errorf("first retry after %v, want at most %v", waited, wire.RetrySchedule.Base)
		}
		// The working endpoint stays preferred.
		if _, err := c.Service().Status(t.Context(), connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
			t.Fatal(err)
		}
		if got := len(down.callsOf("Status")); got != 1 {
			t.Errorf("down endpoint called again: %d calls", got)
		}
		if got := c.ClusterID(); got != "c1" {
			t.Errorf("cluster id %q, want c1", got)
		}
	})
}

func TestRetryCtxEndsMidRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := &transport{status: failing(errConnRefused)}
		c := newTestClient(t, []*transport{down})
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.Service().Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("got %v, want both context.DeadlineExceeded and ErrUnavailable", err)
		}
		if got := time.Since(start); got != 3*time.Second {
			t.Errorf("returned after %v, want at the ctx deadline (3s)", got)
		}
		n := len(down.callsOf("Status"))
		if n < 3 {
			t.Errorf("only %d attempts in 3s", n)
		}
		// Backoff grows: no more attempts than with the base delay throughout.
		if n > int(3*time.Second/wire.RetrySchedule.Base) {
			t.Errorf("%d attempts in 3s: backoff not applied", n)
		}
	})
}

func TestRetryTimeoutWithoutDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := &transport{status: failing(errConnRefused)}
		c := newTestClient(t, []*transport{down}, WithRetryTimeout(10*time.Second))
		start := time.Now()
		_, err := c.Service().Status(context.Background(), connect.NewRequest(&lockdv1.StatusRequest{}))
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("got %v, want ErrUnavailable", err)
		}
		if got := time.Since(start); got > 10*time.Second {
			t.Errorf("gave up after %v, want at most 10s", got)
		}
	})
}

func TestRetryAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hung := &transport{status: func(ctx context.Context, _ *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error) {
			<-ctx.Done()
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}}
		up := &transport{status: statusOK("")}
		c := newTestClient(t, []*transport{hung, up}, WithRequestTimeout(time.Second))
		start := time.Now()
		if _, err := c.Service().Status(t.Context(), connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got < time.Second || got > time.Second+wire.RetrySchedule.Base {
			t.Errorf("took %v, want one attempt timeout (1s) plus a short backoff", got)
		}
	})
}

func TestRetryOnlyWhatIsSafe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// ForceRelease carries no request id: an unavailable answer may
		// come after the server took it, so it is not resent...
		tr := &transport{forceRelease: func(context.Context, *lockdv1.ForceReleaseRequest) (*lockdv1.ForceReleaseResponse, error) {
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))
		}}
		c := newTestClient(t, []*transport{tr, tr})
		_, err := c.Service().ForceRelease(t.Context(), connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "x"}))
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("got %v, want ErrUnavailable", err)
		}
		if got := len(tr.callsOf("ForceRelease")); got != 1 {
			t.Errorf("unsafe call sent %d times, want 1", got)
		}
		// ...but a refused connection or a not-leader answer is.
		n := 0
		tr.forceRelease = func(context.Context, *lockdv1.ForceReleaseRequest) (*lockdv1.ForceReleaseResponse, error) {
			n++
			switch n {
			case 1:
				return nil, apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER)
			case 2:
				return nil, connect.NewError(connect.CodeUnavailable, &netOpErr)
			}
			return &lockdv1.ForceReleaseResponse{SessionIds: []string{"s1"}}, nil
		}
		if _, err := c.Service().ForceRelease(t.Context(), connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "x"})); err != nil {
			t.Fatal(err)
		}
		// Refusals are final.
		n = 0
		tr.forceRelease = func(context.Context, *lockdv1.ForceReleaseRequest) (*lockdv1.ForceReleaseResponse, error) {
			n++
			return nil, apiError(connect.CodeInvalidArgument, lockdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
		}
		if _, err := c.Service().ForceRelease(t.Context(), connect.NewRequest(&lockdv1.ForceReleaseRequest{})); !errors.Is(err, ErrInvalidArgument) || n != 1 {
			t.Errorf("got %v after %d calls, want ErrInvalidArgument after 1", err, n)
		}
		// An outcome-unknown answer is resent only with a request id.
		n = 0
		tr.create = func(_ context.Context, r *lockdv1.CreateSessionRequest) (*lockdv1.CreateSessionResponse, error) {
			n++
			if n == 1 {
				return nil, apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN)
			}
			return &lockdv1.CreateSessionResponse{SessionId: "s"}, nil
		}
		if _, err := c.Service().CreateSession(t.Context(), connect.NewRequest(&lockdv1.CreateSessionRequest{})); !errors.Is(err, ErrUnavailable) || n != 1 {
			t.Errorf("without request id: got %v after %d calls, want ErrUnavailable after 1", err, n)
		}
		n = 0
		if _, err := c.Service().CreateSession(t.Context(), connect.NewRequest(&lockdv1.CreateSessionRequest{RequestId: "r"})); err != nil || n != 2 {
			t.Errorf("with request id: got %v after %d calls, want success after 2", err, n)
		}
	})
}

func TestClusterMismatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &transport{status: statusOK("cluster-a")}
		b := &transport{status: statusOK("cluster-b")}
		c := newTestClient(t, []*transport{a, b})
		req := connect.NewRequest(&lockdv1.StatusRequest{})
		if _, err := c.Service().Status(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		// a fails twice; b belongs to another cluster and is refused.
		n := 0
		a.status = func(ctx context.Context, r *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error) {
			if n++; n <= 2 {
				return nil, errConnRefused
			}
			return statusOK("cluster-a")(ctx, r)
		}
		if _, err := c.Service().Status(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		if got := len(b.callsOf("Status")); got != 1 {
			t.Errorf("b called %d times, want once", got)
		}
		// b is never used again.
		a.status = failing(errConnRefused)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := c.Service().Status(ctx, req); !errors.Is(err, ErrUnavailable) {
			t.Errorf("got %v, want ErrUnavailable", err)
		}
		if got := len(b.callsOf("Status")); got != 1 {
			t.Errorf("refused endpoint called again")
		}
		// a is wiped and bootstrapped into a new cluster: nothing is left.
		a.status = statusOK("cluster-c")
		if _, err := c.Service().Status(t.Context(), req); !errors.Is(err, ErrClusterMismatch) {
			t.Fatalf("got %v, want ErrClusterMismatch", err)
		}
		if got := c.ClusterID(); got != "cluster-a" {
			t.Errorf("cluster id %q, want cluster-a", got)
		}
	})
}

// Two nodes that each name the other as leader (stale hints during an
// election): following hints must not skip backoff forever, and a call with
// a deadline-free ctx must stop at the retry timeout.
func TestRetryHintPingPongIsBounded(t *testing.T) {
	synctest.Test(t, testRetryHintPingPong)
}

func testRetryHintPingPong(t *testing.T) {
	ts := []*transport{{cluster: "c"}, {cluster: "c"}}
	for i, f := range ts {
		other := "http://ep" + string(rune('0'+1-i)) + ":7070"
		f.create = func(context.Context, *lockdv1.CreateSessionRequest) (*lockdv1.CreateSessionResponse, error) {
			return nil, apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER,
				func(d *lockdv1.ErrorDetail) { d.LeaderApi = other })
		}
	}
	c := newTestClient(t, ts, WithRetryTimeout(500*time.Millisecond))
	done := make(chan error, 1)
	go func() { _, err := c.NewSession(context.Background()); done <- err }()
	select {
	case err := <-done:
		n := len(ts[0].callsOf("CreateSession")) + len(ts[1].callsOf("CreateSession"))
		if !errors.Is(err, ErrUnavailable) || n > 100 {
			t.Fatalf("NewSession: %v after %d attempts, want ErrUnavailable after a bounded number", err, n)
		}
	case <-time.After(3 * time.Second):
		n := len(ts[0].callsOf("CreateSession")) + len(ts[1].callsOf("CreateSession"))
		t.Fatalf("NewSession still retrying after 3s with a 500ms retry timeout; %d attempts, no backoff", n)
	}
}

// One endpoint down, the other healthy but the lock busy: Lock with a
// deadline must end as "wait ran out" (lockd run: 75), not "unavailable"
// (69) because an earlier attempt failed.
func TestWaitTimeoutIsNotUnavailable(t *testing.T) {
	synctest.Test(t, testWaitTimeoutIsNotUnavailable)
}

func testWaitTimeoutIsNotUnavailable(t *testing.T) {
	ts := []*transport{{cluster: "c"}, {cluster: "c"}}
	ts[0].create = func(context.Context, *lockdv1.CreateSessionRequest) (*lockdv1.CreateSessionResponse, error) {
		return nil, errConnRefused
	}
	ts[0].acquire = func(context.Context, *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
		return nil, errConnRefused
	}
	ts[0].cancel = func(context.Context, *lockdv1.CancelRequest) (*lockdv1.CancelResponse, error) {
		return nil, errConnRefused
	}
	ts[1].keepAlive = okKeepAlive(10 * time.Second)
	ts[1].acquire = func(ctx context.Context, r *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
		<-ctx.Done()
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	ts[1].cancel = func(context.Context, *lockdv1.CancelRequest) (*lockdv1.CancelResponse, error) {
		return &lockdv1.CancelResponse{}, nil
	}
	c := newTestClient(t, ts)
	defer c.Close(context.Background())
	s, err := c.NewSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Start the next call at the dead endpoint.
	c.mu.Lock()
	c.eps.SetCurrent(0)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = s.NewMutex("x").Lock(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Errorf("wait ran out on a healthy endpoint, but err matches ErrUnavailable (lockd run exits 69, not 75): %v", err)
	}
}

// A server may name the leader in any error answer, not only "not leader"
// (a follower whose forward failed, an unknown outcome): the client goes
// there next, at once, and stays there for later calls.
func TestRetryFollowsLeaderInAnyAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"not leader", apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER,
			func(d *lockdv1.ErrorDetail) { d.LeaderApi = "http://ep2:7070" })},
		{"outcome unknown", apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN,
			func(d *lockdv1.ErrorDetail) { d.LeaderApi = "http://ep2:7070" })},
		{"unavailable", apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED,
			func(d *lockdv1.ErrorDetail) { d.LeaderApi = "ep2" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				follower := &transport{status: failing(tc.err)}
				other := &transport{status: failing(errConnRefused)}
				leader := &transport{status: statusOK("")}
				c := newTestClient(t, []*transport{follower, other, leader})
				start := time.Now()
				if _, err := c.Service().Status(t.Context(), connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
					t.Fatal(err)
				}
				if got := len(other.callsOf("Status")); got != 0 {
					t.Errorf("the leader named was not followed: another endpoint called %d times", got)
				}
				if waited := time.Since(start); waited != 0 {
					t.Errorf("waited %v before going to the leader, want 0", waited)
				}
				if _, err := c.Service().Status(t.Context(), connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
					t.Fatal(err)
				}
				if got := len(follower.callsOf("Status")); got != 1 {
					t.Errorf("follower called %d times, want once: later calls go to the leader", got)
				}
			})
		})
	}
}

// A hung endpoint costs a call at most half of what its deadline leaves,
// not the whole request timeout, and later calls pass it over while it has
// not answered lately.
func TestRetryPassesOverHungEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hung := &transport{status: func(ctx context.Context, _ *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error) {
			<-ctx.Done()
			return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}}
		up := &transport{status: statusOK("")}
		c := newTestClient(t, []*transport{hung, up})
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		if _, err := c.Service().Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
			t.Fatal(err)
		}
		if got, want := time.Since(start), time.Second+wire.RetrySchedule.Base; got > want {
			t.Errorf("took %v with a 2s deadline, want at most %v (half the deadline, then the next endpoint)", got, want)
		}
		c.eps.SetCurrent(0) // as if a hint had named the hung endpoint
		if _, err := c.Service().Status(t.Context(), connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
			t.Fatal(err)
		}
		if got := len(hung.callsOf("Status")); got != 1 {
			t.Errorf("hung endpoint called %d times, want once: it did not answer lately", got)
		}
		// After a while it is tried again.
		time.Sleep(wire.SilentFor)
		c.eps.SetCurrent(0)
		if _, err := c.Service().Status(t.Context(), connect.NewRequest(&lockdv1.StatusRequest{})); err != nil {
			t.Fatal(err)
		}
		if got := len(hung.callsOf("Status")); got != 2 {
			t.Errorf("hung endpoint called %d times, want twice: tried again after %v", got, wire.SilentFor)
		}
	})
}
