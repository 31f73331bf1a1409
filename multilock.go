package lockd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/wire"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// maxMultiLocks is the most locks one MultiLock takes (the server's
// limit).
const maxMultiLocks = 32

// MultiLock takes several exclusive locks all at once: the server decides
// the whole set in one entry, granting every lock together or queueing one
// request that it grants only when it can take them all. It never holds
// part of the set while waiting for the rest, so taking sets in any order
// cannot deadlock among waiters. Each lock gets its own fencing token. Not
// re-entrant; safe for concurrent use.
type MultiLock struct {
	s       *Session
	names   []string
	locks   map[string]*lock // per-name plumbing: cancel and release by name
	value   []byte
	maxHold time.Duration
	bad     error

	mu   sync.Mutex
	busy bool
	h    *multiHold

	// Release-request notices (notices.go): nil until asked for.
	notes   chan ReleaseRequest
	noted   map[string]notedHold      // by name, the last hold notified
	early   map[string]ReleaseRequest // by name, notices that came before the grant was installed
	tracked bool                      // the hub knows m (it acquires or holds)
}

type multiHold struct {
	tokens   map[string]uint64
	ctx      context.Context
	cancel   context.CancelCauseFunc
	deadline time.Time
}

// NewMultiLock returns a handle on the exclusive locks names (2 to 32,
// distinct), taken together through this session. WithValue and
// WithMaxHold apply to every lock of the set; WithLockDelay is not
// supported. A bad name list or option is reported by every Lock and
// TryLock as an error matching ErrInvalidArgument.
func (s *Session) NewMultiLock(names []string, opts ...LockOption) *MultiLock {
	var cfg lockConfig
	var err error
	for _, o := range opts {
		if o != nil && err == nil {
			err = o(&cfg)
		}
	}
	seen := map[string]bool{}
	switch {
	case err != nil:
	case len(names) < 2 || len(names) > maxMultiLocks:
		err = fmt.Errorf("%w: a multi-lock takes 2 to %d locks, not %d", ErrInvalidArgument, maxMultiLocks, len(names))
	case cfg.lockDelay != 0:
		err = fmt.Errorf("%w: a multi-lock has no lock-delay", ErrInvalidArgument)
	}
	m := &MultiLock{s: s, names: append([]string(nil), names...), locks: map[string]*lock{}, value: cfg.value, maxHold: cfg.maxHold}
	for _, n := range names {
		if seen[n] && err == nil {
			err = fmt.Errorf("%w: lock %q named twice", ErrInvalidArgument, n)
		}
		seen[n] = true
		m.locks[n] = newLock(s, n, nil, nil)
	}
	if err != nil {
		m.bad = fmt.Errorf("multi-lock %v: %w", names, err)
	}
	return m
}

// Lock takes every lock of the set, waiting until the server can grant them
// all at once or ctx ends (then the request is withdrawn, and a grant that
// raced in is released).
func (m *MultiLock) Lock(ctx context.Context) error { return m.acquire(ctx, true) }

// TryLock takes every lock of the set if all are free now, else fails with
// an error matching ErrBusy, holding none.
func (m *MultiLock) TryLock(ctx context.Context) error { return m.acquire(ctx, false) }

func (m *MultiLock) acquire(ctx context.Context, wait bool) error {
	s := m.s
	if m.bad != nil {
		return m.bad
	}
	if err := s.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.h != nil || m.busy {
		m.mu.Unlock()
		return fmt.Errorf("acquire %v: %w", m.names, ErrAlreadyHeld)
	}
	m.busy = true
	m.track()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.busy = false
		if m.h == nil {
			m.untrack()
		}
		m.mu.Unlock()
	}()
	bctx, stop := s.bind(ctx)
	defer stop()
	seq := s.seqs.Begin()
	defer seq.End()
	var since time.Time // as in lock.acquire: a send known to precede the grant
	for {
		sent := time.Now()
		if since.IsZero() {
			since = sent
		}
		msg := &lockdv1.AcquireManyRequest{SessionId: s.id, Secret: s.secret, Seq: seq.Seq, Ack: s.seqs.Ack(), Wait: wait, Value: m.value}
		for _, n := range m.names {
			msg.Locks = append(msg.Locks, &lockdv1.LockRequest{Name: n, Mode: lockdv1.Mode_MODE_EXCLUSIVE})
		}
		if m.maxHold > 0 {
			msg.MaxHold = durationpb.New(m.maxHold)
		}
		p := s.policy(wire.AcquireMany.PolicyOf(msg))
		if wait {
			p.Poll = wire.AcquireMany.MaxPoll
			if dl, ok := ctx.Deadline(); ok {
				p.Poll = max(min(p.Poll, time.Until(dl)), time.Millisecond)
			}
			msg.PollTimeout = durationpb.New(p.Poll)
		}
		resp, err := wire.AcquireMany.Invoke(bctx, s.c.call, p, msg, nil)
		if err != nil {
			if serr := s.Err(); serr != nil {
				return serr
			}
			if errors.Is(err, ErrLeaseLost) {
				s.lose(err)
				return s.Err()
			}
			if wait && ctx.Err() == nil && errors.Is(err, ErrUnavailable) && !definitive(err) {
				if werr := m.locks[m.names[0]].pauseWait(ctx); werr != nil {
					return werr
				}
				continue // the same seq keeps the request's place
			}
			if ctx.Err() != nil || !definitive(err) {
				m.withdraw(ctx, seq)
			}
			return fmt.Errorf("acquire %v: %w", m.names, err)
		}
		switch st := resp.Msg.GetStatus(); st {
		case lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED:
			return m.granted(resp.Msg, since)
		case lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED:
			if wait {
				since = sent
				continue
			}
			fallthrough
		default:
			m.withdraw(ctx, seq)
			return fmt.Errorf("acquire %v: unexpected status %v", m.names, st)
		}
	}
}

// granted installs the set's hold, unless the session or the budget ended
// meanwhile.
func (m *MultiLock) granted(resp *lockdv1.AcquireManyResponse, since time.Time) error {
	s := m.s
	tokens := map[string]uint64{}
	for _, g := range resp.GetGrants() {
		tokens[g.GetName()] = g.GetToken()
	}
	for _, n := range m.names {
		if tokens[n] == 0 {
			return fmt.Errorf("acquire %v: grant without a token for %q", m.names, n)
		}
	}
	if err := s.live(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.ctx.Err() != nil {
		return s.Err()
	}
	ctx, cancel, dl := holdContext(s.ctx, since, resp.GetMaxHold().AsDuration())
	if !dl.IsZero() && !time.Now().Before(dl) {
		cancel(ErrHoldExpired)
		for n, tok := range tokens {
			l := m.locks[n]
			s.keepTrying(func() error { return l.releaseToken(context.Background(), tok) }, func() {})
		}
		return fmt.Errorf("acquire %v: granted after the hold's client deadline: %w", m.names, ErrHoldExpired)
	}
	m.h = &multiHold{tokens: tokens, ctx: ctx, cancel: cancel, deadline: dl}
	m.noticeGranted()
	return nil
}

// withdraw cancels the request on the server: a Cancel naming its first
// lock drops the whole queued request; if the set was granted meanwhile,
// a Cancel per lock releases each hold.
func (m *MultiLock) withdraw(ctx context.Context, acq *wire.SeqReq) {
	for _, n := range m.names {
		m.locks[n].withdraw(ctx, acq)
	}
}

// Unlock releases every lock of the set still held. The set's context ends
// first, so work under it stops before another holder may start.
func (m *MultiLock) Unlock(ctx context.Context) error {
	m.mu.Lock()
	h := m.h
	m.h = nil
	if h != nil {
		m.untrack()
	}
	m.mu.Unlock()
	if h == nil {
		return fmt.Errorf("release %v: %w", m.names, ErrNotHeld)
	}
	h.cancel(ErrNotHeld)
	var errs []error
	for _, n := range m.names {
		tok, ok := h.tokens[n]
		if !ok {
			continue // released alone already
		}
		if err := m.release(ctx, h, n, tok); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// UnlockOne releases one lock of the set and keeps the others; the set's
// context stays until Unlock (which releases the rest).
func (m *MultiLock) UnlockOne(ctx context.Context, name string) error {
	m.mu.Lock()
	h := m.h
	var tok uint64
	if h != nil {
		tok = h.tokens[name]
		delete(h.tokens, name)
	}
	m.mu.Unlock()
	if tok == 0 {
		return fmt.Errorf("release %q: %w", name, ErrNotHeld)
	}
	return m.release(ctx, h, name, tok)
}

func (m *MultiLock) release(ctx context.Context, h *multiHold, name string, token uint64) error {
	s := m.s
	if s.ctx.Err() != nil {
		return fmt.Errorf("release %q: %w", name, s.Err())
	}
	l := m.locks[name]
	err := l.releaseToken(ctx, token)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotHeld) && !h.deadline.IsZero() && !time.Now().Before(h.deadline):
		return fmt.Errorf("release %q: %w", name, ErrHoldExpired)
	case s.ctx.Err() != nil:
		return fmt.Errorf("release %q: %w", name, s.Err())
	case definitive(err):
		return fmt.Errorf("release %q: %w", name, err)
	}
	s.keepTrying(func() error { return l.releaseToken(context.Background(), token) }, func() {})
	return fmt.Errorf("release %q: %w", name, err)
}

// Tokens returns the fencing token of each lock of the set still held, by
// name; nil when not held.
func (m *MultiLock) Tokens() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil {
		return nil
	}
	out := make(map[string]uint64, len(m.h.tokens))
	for n, t := range m.h.tokens {
		out[n] = t
	}
	return out
}

// Context returns a context that ends when the set's hold ends: Unlock, the
// session's end, or the hold's budget (ErrHoldExpired as its cause).
func (m *MultiLock) Context() context.Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil {
		return notHeldCtx
	}
	return m.h.ctx
}

// Done is Context().Done().
func (m *MultiLock) Done() <-chan struct{} { return m.Context().Done() }

// Deadline returns until when the set's hold may be believed: the earlier
// of the session's lease deadline and the hold's budget; zero when not
// held.
func (m *MultiLock) Deadline() time.Time {
	m.mu.Lock()
	h := m.h
	m.mu.Unlock()
	if h == nil {
		return time.Time{}
	}
	dl := m.s.Deadline()
	if !h.deadline.IsZero() && h.deadline.Before(dl) {
		dl = h.deadline
	}
	return dl
}

// Names returns the set's lock names, in the order given.
func (m *MultiLock) Names() []string { return append([]string(nil), m.names...) }
