package lockd

import (
	"context"
	"fmt"
	"sync"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Election elects one leader among the sessions campaigning on a name: the
// leader is the holder of an exclusive lock of that name, and candidates
// wait in the server's FIFO queue, so leadership passes in campaign order
// and only when the leader resigns or its lease is lost. The leader's token
// fences its writes like any lock's. Its methods are safe for concurrent
// use; one Election value campaigns at most once at a time.
type Election struct {
	s    *Session
	name string

	mu          sync.Mutex
	m           *Mutex // the current campaign, nil before the first
	campaigning bool   // a Campaign call is in progress
}

// NewElection returns an election on name for this session. Nothing is sent
// until Campaign or Leader.
func (s *Session) NewElection(name string) *Election {
	return &Election{s: s, name: name}
}

// Campaign waits until this session is the leader, announcing value (at
// most 1 KiB, shown by Leader to everyone). A second Campaign while one is
// in progress or while leading fails with ErrAlreadyHeld. When ctx ends first, the
// campaign is withdrawn and the error matches ctx.Err(). Leadership lasts
// until Resign or until the session's lease is lost; watch Done.
func (e *Election) Campaign(ctx context.Context, value []byte) error {
	e.mu.Lock()
	if e.campaigning || e.m != nil && e.m.Err() == nil {
		e.mu.Unlock()
		return fmt.Errorf("campaign %q: %w", e.name, ErrAlreadyHeld)
	}
	m := e.s.NewMutex(e.name, WithValue(value))
	e.m, e.campaigning = m, true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.campaigning = false
		e.mu.Unlock()
	}()
	return m.Lock(ctx)
}

// Resign gives up leadership (or returns ErrNotHeld when not the leader);
// the next candidate in line becomes the leader.
func (e *Election) Resign(ctx context.Context) error {
	m := e.current()
	if m == nil {
		return fmt.Errorf("resign %q: %w", e.name, ErrNotHeld)
	}
	return m.Unlock(ctx)
}

// Leader is who leads an election.
type Leader struct {
	// SessionID and Owner identify the leader's session.
	SessionID, Owner string
	// Value is what the leader announced in Campaign.
	Value []byte
	// Token is the leader's fencing token.
	Token uint64
}

// Leader returns the current leader (a linearizable read), or an error
// matching ErrNoLeader when there is none.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	resp, err := e.s.c.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: e.name}))
	if err != nil {
		return Leader{}, fmt.Errorf("leader of %q: %w", e.name, err)
	}
	for _, h := range resp.Msg.GetLock().GetHolders() {
		return Leader{SessionID: h.GetSessionId(), Owner: h.GetOwner(), Value: h.GetValue(), Token: h.GetToken()}, nil
	}
	return Leader{}, fmt.Errorf("leader of %q: %w", e.name, ErrNoLeader)
}

// Token returns this session's leadership token, 0 when not the leader.
func (e *Election) Token() uint64 {
	if m := e.current(); m != nil {
		return m.Token()
	}
	return 0
}

// Context returns a context that ends when this session's leadership ends
// (Resign or lease loss); it is already done when not the leader.
func (e *Election) Context() context.Context {
	if m := e.current(); m != nil {
		return m.Context()
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrNotHeld)
	return ctx
}

// Done is Context().Done().
func (e *Election) Done() <-chan struct{} { return e.Context().Done() }

// Err returns nil while this session leads, else why not.
func (e *Election) Err() error {
	if m := e.current(); m != nil {
		return m.Err()
	}
	return ErrNotHeld
}

func (e *Election) current() *Mutex {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m
}
