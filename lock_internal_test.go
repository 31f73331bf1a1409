package lockd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// These tests check the client's side of the acquire protocol (sequence
// numbers, long polls, withdrawal); lock semantics are tested against a real
// server in lock_test.go.

// queued answers every Acquire with QUEUED after its poll timeout.
func queued(ctx context.Context, r *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
	t := time.NewTimer(r.GetPollTimeout().AsDuration())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	case <-t.C:
		return &lockdv1.AcquireResponse{Status: lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED, Position: 2}, nil
	}
}

func TestLockPollsWithSameSeqAndWithdraws(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &transport{
			keepAlive: okKeepAlive(time.Hour),
			acquire:   queued,
			cancel: func(context.Context, *lockdv1.CancelRequest) (*lockdv1.CancelResponse, error) {
				return &lockdv1.CancelResponse{Released: true}, nil
			},
		}
		c := newTestClient(t, []*transport{tr})
		s, err := c.NewSession(t.Context(), WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		mu := s.NewMutex("invoices")
		err = mu.Lock(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock = %v, want context.DeadlineExceeded", err)
		}
		acq := tr.callsOf("Acquire")
		// 25s + 25s + 10s: polls capped at 25s and at the time left. (The
		// last poll ends together with ctx, so a fourth may start.)
		if len(acq) != 3 && len(acq) != 4 {
			t.Fatalf("%d acquire polls in a minute, want 3", len(acq))
		}
		var polls []time.Duration
		for _, a := range acq {
			r := a.msg.(*lockdv1.AcquireRequest)
			polls = append(polls, r.GetPollTimeout().AsDuration())
			if r.GetSeq() != 1 || r.GetAck() != 1 || !r.GetWait() || r.GetName() != "invoices" || r.GetMode() != lockdv1.Mode_MODE_EXCLUSIVE || r.Limit != nil {
				t.Errorf("acquire %v", r)
			}
		}
		if polls[0] != 25*time.Second || polls[1] != 25*time.Second || polls[2] != 10*time.Second || len(polls) == 4 && polls[3] != time.Millisecond {
			t.Errorf("poll timeouts %v, want [25s 25s 10s]", polls)
		}
		cn := tr.callsOf("Cancel")
		if len(cn) != 1 {
			t.Fatalf("%d cancels, want 1", len(cn))
		}
		if r := cn[0].msg.(*lockdv1.CancelRequest); r.GetAcquireSeq() != 1 || r.GetSeq() != 2 || r.GetAck() != 1 || r.GetName() != "invoices" {
			t.Errorf("cancel %v", r)
		}
		if mu.Err() == nil || mu.Token() != 0 {
			t.Error("lock reported held after a cancelled wait")
		}
		// Both requests were answered: the next one acknowledges them.
		tr.acquire = func(context.Context, *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
			return &lockdv1.AcquireResponse{Status: lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, Token: 42}, nil
		}
		if err := mu.TryLock(t.Context()); err != nil {
			t.Fatal(err)
		}
		acq = tr.callsOf("Acquire")
		if r := acq[len(acq)-1].msg.(*lockdv1.AcquireRequest); r.GetSeq() != 3 || r.GetAck() != 3 || r.GetWait() {
			t.Errorf("try acquire %v", r)
		}
		if mu.Token() != 42 || mu.Err() != nil {
			t.Errorf("token %d err %v", mu.Token(), mu.Err())
		}
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := mu.Err(); !errors.Is(err, ErrSessionClosed) {
			t.Errorf("lock Err after session Close = %v, want ErrSessionClosed", err)
		}
	})
}

func TestLockWaiterLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 2 * time.Second
		var mu sync.Mutex
		dead := false
		tr := &transport{
			keepAlive: func(ctx context.Context, r *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
				mu.Lock()
				defer mu.Unlock()
				if dead {
					return nil, connect.NewError(connect.CodeUnavailable, errors.New("connection refused"))
				}
				return okKeepAlive(ttl)(ctx, r)
			},
			acquire: queued,
		}
		c := newTestClient(t, []*transport{tr})
		s, err := c.NewSession(t.Context(), WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		dead = true
		mu.Unlock()
		err = s.NewMutex("invoices").Lock(context.Background())
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Lock = %v, want ErrLeaseLost", err)
		}
		select {
		case <-s.Done():
		default:
			t.Fatal("Lock returned lease lost before the session's Done")
		}
		if got, want := time.Now(), s.Deadline(); !got.Equal(want) {
			t.Errorf("Lock returned at %v, want at the lease deadline %v", got, want)
		}
		synctest.Wait()
		c.Close(context.Background())
	})
}

func TestLockGrantAfterLeaseLostIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s *Session
		tr := &transport{
			keepAlive: okKeepAlive(time.Hour),
			acquire: func(context.Context, *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
				// The lease is lost while the grant is on its way back.
				s.lose(errors.New("test"))
				return &lockdv1.AcquireResponse{Status: lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, Token: 7}, nil
			},
		}
		c := newTestClient(t, []*transport{tr})
		var err error
		s, err = c.NewSession(t.Context(), WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		mu := s.NewMutex("invoices")
		if err := mu.TryLock(t.Context()); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("TryLock = %v, want ErrLeaseLost", err)
		}
		if mu.Token() != 0 {
			t.Error("grant reported after the session's Done")
		}
		synctest.Wait()
		c.Close(context.Background())
	})
}

func TestUnlockCancelsHoldContextFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu *Mutex
		var ctxDoneAtRelease bool
		tr := &transport{
			keepAlive: okKeepAlive(time.Hour),
			acquire: func(context.Context, *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
				return &lockdv1.AcquireResponse{Status: lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, Token: 9}, nil
			},
		}
		c := newTestClient(t, []*transport{tr})
		s, err := c.NewSession(t.Context(), WithTTL(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		mu = s.NewMutex("invoices")
		if err := mu.Lock(t.Context()); err != nil {
			t.Fatal(err)
		}
		held := mu.Context()
		tr.release = func(_ context.Context, r *lockdv1.ReleaseRequest) (*lockdv1.ReleaseResponse, error) {
			ctxDoneAtRelease = held.Err() != nil
			if r.GetToken() != 9 {
				t.Errorf("release token %d, want 9", r.GetToken())
			}
			return &lockdv1.ReleaseResponse{}, nil
		}
		if err := mu.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !ctxDoneAtRelease {
			t.Error("hold context still live when the release was sent")
		}
		if err := mu.Err(); !errors.Is(err, ErrNotHeld) {
			t.Errorf("Err after Unlock = %v, want ErrNotHeld", err)
		}
		if err := mu.Unlock(t.Context()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("second Unlock = %v, want ErrNotHeld", err)
		}
		c.Close(context.Background())
	})
}
