package lockd

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

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
	defer c.Close()
	s, err := c.NewSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Start the next call at the dead endpoint.
	c.mu.Lock()
	c.cur = 0
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = s.NewMutex("x").Lock(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Errorf("wait ran out on a healthy endpoint, but err matches ErrUnavailable (lockd run exits 69, not 75): %v", err)
	}
}
