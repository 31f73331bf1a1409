package lockd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// notHeldCtx is the Context of a lock that is not held.
var notHeldCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrNotHeld)
	return ctx
}()

// lock is the machinery shared by Mutex, Semaphore and RWMutex: one hold
// at a time, taken through a session.
type lock struct {
	s         *Session
	name      string
	limit     *uint32 // nil: the lock's existing limit (1 for a new lock)
	value     []byte
	lockDelay time.Duration
	maxHold   time.Duration // asked hold budget, 0: the server's default
	bad       error         // a bad option, reported by every acquire

	mu   sync.Mutex
	busy bool  // an acquire is in flight
	h    *hold // the current hold, nil when not held

	// Release-request notices (notices.go): nil until asked for.
	notes   chan ReleaseRequest
	noted   notedHold       // the last hold notified
	early   *ReleaseRequest // a notice that came before its grant was installed
	tracked bool            // the hub knows l (it acquires or holds)
}

type hold struct {
	token  uint64
	shared bool
	// ctx is made on first use (lock.context), under lock.mu while the
	// hold is current: most holds are never asked for theirs, and each
	// would cost a child of the session's context. nil until then.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// deadline is the client's end of the hold's budget (zero: none).
	deadline time.Time
}

// end cancels the hold's context, if one was made. The hold is no longer
// current (taken off lock.h under lock.mu first), so no ctx is made after.
func (h *hold) end() {
	if h.cancel != nil {
		h.cancel(ErrNotHeld)
	}
}

func newLock(s *Session, name string, limit *uint32, opts []LockOption) *lock {
	var cfg lockConfig
	var err error
	for _, o := range opts {
		if o != nil && err == nil {
			err = o(&cfg)
		}
	}
	if err != nil {
		err = fmt.Errorf("lock %q: %w", name, err)
	}
	return &lock{s: s, name: name, limit: limit, value: cfg.value, lockDelay: cfg.lockDelay, maxHold: cfg.maxHold, bad: err}
}

// acquire takes the lock in a mode. With wait it queues on the server until
// granted or ctx ends; then it withdraws the wait (releasing a grant that
// raced in) and returns an error matching ctx.Err().
func (l *lock) acquire(ctx context.Context, shared, wait bool) error {
	s := l.s
	if l.bad != nil {
		return l.bad
	}
	if err := s.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	if l.h != nil || l.busy {
		l.mu.Unlock()
		return fmt.Errorf("acquire %q: %w", l.name, ErrAlreadyHeld)
	}
	l.busy = true
	l.track()
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.busy = false
		if l.h == nil {
			l.untrack()
		}
		l.mu.Unlock()
	}()

	mode := lockdv1.Mode_MODE_EXCLUSIVE
	if shared {
		mode = lockdv1.Mode_MODE_SHARED
	}
	bctx, stop := s.bind(ctx)
	defer stop()
	// Every repeat of a long poll resumes the same wait: same seq. The seq
	// stays in flight until this returns, or until the withdrawal that
	// takes it over ends.
	seq := s.seqs.Begin()
	defer seq.End()
	// since is the send time of a call known to precede the grant: this
	// seq's first call, then each call the leader answered "queued" (it
	// reads its state after the call was sent, and grants after that).
	// A hold budget is counted from it (the lease rule's client half).
	var since time.Time
	for {
		sent := time.Now()
		if since.IsZero() {
			since = sent
		}
		msg := &lockdv1.AcquireRequest{
			SessionId: s.id, Secret: s.secret, Seq: seq.Seq, Ack: s.seqs.Ack(), Name: l.name, Mode: mode,
			Limit: l.limit, Wait: wait, Value: l.value,
		}
		if l.lockDelay > 0 {
			msg.LockDelay = durationpb.New(l.lockDelay)
		}
		if l.maxHold > 0 {
			msg.MaxHold = durationpb.New(l.maxHold)
		}
		p := s.policy(wire.Acquire.PolicyOf(msg))
		if wait {
			p.Poll = wire.Acquire.MaxPoll
			if dl, ok := ctx.Deadline(); ok {
				p.Poll = max(min(p.Poll, time.Until(dl)), time.Millisecond)
			}
			msg.PollTimeout = durationpb.New(p.Poll)
		}
		resp, err := wire.Acquire.Call(bctx, s.c.call, p, msg)
		if err != nil {
			if serr := s.Err(); serr != nil {
				return serr
			}
			if errors.Is(err, ErrLeaseLost) {
				s.lose(err)
				return s.Err()
			}
			if wait && ctx.Err() == nil && errors.Is(err, ErrUnavailable) && !definitive(err) {
				// No answer within the retry timeout (a node froze or
				// died under the wait, no leader for a while) while the
				// session lives: its lease says the cluster is reachable
				// enough, and it ends the wait (ErrLeaseLost) when not.
				// Wait on with the same seq, so the server's duplicate
				// table answers the repeat and the wait keeps its place
				// in the queue; a withdrawal and a new request would
				// queue at the back, and one that landed before the
				// withdrawal would be refused as already held.
				s.c.logger.Warn("lock wait: cluster unavailable, still waiting", "lock", l.name, "session", s.id, "err", err)
				if werr := l.pauseWait(ctx); werr != nil {
					return werr
				}
				continue
			}
			if ctx.Err() != nil || !definitive(err) {
				// The request may sit in the queue, or even hold the lock.
				l.withdraw(ctx, seq)
			}
			return fmt.Errorf("acquire %q: %w", l.name, err)
		}
		switch st := resp.GetStatus(); st {
		case lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED:
			return l.granted(resp.GetToken(), shared, since, resp.GetMaxHold().AsDuration())
		case lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED:
			if wait {
				since = sent
				continue
			}
			fallthrough
		default:
			l.withdraw(ctx, seq)
			return fmt.Errorf("acquire %q: unexpected status %v", l.name, st)
		}
	}
}

// waitRepeatPause is the pause before a wait is repeated after the
// cluster did not answer: the failed call already retried for the retry
// timeout, so this only keeps a tiny retry timeout from spinning.
const waitRepeatPause = 100 * time.Millisecond

// pauseWait waits waitRepeatPause before a wait is repeated. When ctx or
// the session ends first it returns what acquire returns then: the wait
// withdrawn and ctx's error, or the session's.
func (l *lock) pauseWait(ctx context.Context) error {
	t := time.NewTimer(waitRepeatPause)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-l.s.ctx.Done():
		return l.s.Err()
	case <-ctx.Done():
		return nil // the next attempt sees ctx ended and withdraws
	}
}

// definitive reports whether err is a refusal the server decided on, so
// that the request is surely not queued or granted (or, for ErrClosed and
// ErrClusterMismatch, whether no retry can ever reach the cluster).
func definitive(err error) bool {
	var be *BusyError
	if errors.As(err, &be) {
		return true
	}
	for _, k := range []error{ErrInvalidArgument, ErrAlreadyHeld, ErrLimitMismatch, ErrWaitDropped, ErrTooMany, ErrNotHeld, ErrClosed, ErrClusterMismatch, ErrAlreadyDone, ErrDeadlock} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// granted installs a hold, unless the session ended meanwhile: a grant is
// never reported after the session's Done was closed (the server releases
// such a hold when it ends the session).
func (l *lock) granted(token uint64, shared bool, since time.Time, budget time.Duration) error {
	if err := l.s.live(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s.ctx.Err() != nil {
		return l.s.Err()
	}
	dl := holdDeadline(since, budget)
	if !dl.IsZero() && !time.Now().Before(dl) {
		// Granted, but the budget's client end has passed already (a
		// short budget, a slow answer): never report it held. The server
		// ends it on its own timer; release it now for the next waiter.
		l.s.keepTrying(func() error { return l.releaseToken(context.Background(), token) }, func() {})
		return fmt.Errorf("acquire %q: granted after the hold's client deadline: %w", l.name, ErrHoldExpired)
	}
	l.h = &hold{token: token, shared: shared, deadline: dl}
	l.noticeGranted()
	if l.s.c.logger.Enabled(context.Background(), slog.LevelDebug) {
		l.s.c.logger.Debug("lock granted", "lock", l.name, "session", l.s.id, "token", token)
	}
	return nil
}

// withdraw cancels the acquire acq on the server, on a fresh context
// bounded by twice the request timeout. If that fails it keeps trying in
// the background until it succeeds or the session ends, so that a wait
// nobody listens to cannot be granted and then stick; acq stays in flight
// until then.
func (l *lock) withdraw(ctx context.Context, acq *wire.SeqReq) {
	s := l.s
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*s.c.cfg.requestTimeout)
	err := l.cancelWait(cctx, acq.Seq)
	cancel()
	if err == nil || s.ctx.Err() != nil || definitive(err) {
		return
	}
	s.c.logger.Warn("cancel of wait failed; retrying in the background", "lock", l.name, "session", s.id, "err", err)
	owned := acq.Pass()
	if owned == nil {
		return
	}
	s.keepTrying(func() error { return l.cancelWait(context.Background(), owned.Seq) }, owned.End)
}

// cancelWait sends one Cancel (with retries).
func (l *lock) cancelWait(ctx context.Context, acquireSeq uint64) error {
	s := l.s
	bctx, stop := s.bind(ctx)
	defer stop()
	seq := s.seqs.Begin()
	defer seq.End()
	msg := &lockdv1.CancelRequest{SessionId: s.id, Secret: s.secret, Seq: seq.Seq, Ack: s.seqs.Ack(), Name: l.name, AcquireSeq: acquireSeq}
	resp, err := wire.Cancel.Call(bctx, s.c.call, s.policy(wire.Cancel.PolicyOf(msg)), msg)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			s.lose(err)
		}
		return err
	}
	if resp.GetReleased() {
		s.c.logger.Info("raced grant released", "lock", l.name, "session", s.id)
	}
	return nil
}

// release gives up the hold taken in the given mode. The hold's context is
// cancelled before the server is asked, so work under it stops before the
// next holder may start.
func (l *lock) release(ctx context.Context, shared bool) error {
	s := l.s
	l.mu.Lock()
	h := l.h
	if h == nil || h.shared != shared {
		l.mu.Unlock()
		return fmt.Errorf("release %q: %w", l.name, ErrNotHeld)
	}
	l.h = nil
	l.untrack()
	l.mu.Unlock()
	h.end()
	if s.ctx.Err() != nil {
		// The session ended: the server has dropped (or will drop) the hold.
		return fmt.Errorf("release %q: %w", l.name, s.Err())
	}
	err := l.releaseToken(ctx, h.token)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotHeld) && !h.deadline.IsZero() && !time.Now().Before(h.deadline):
		// The budget ran out: the server ended the hold (or will).
		return fmt.Errorf("release %q: %w", l.name, ErrHoldExpired)
	case s.ctx.Err() != nil:
		return fmt.Errorf("release %q: %w", l.name, s.Err())
	case definitive(err):
		return fmt.Errorf("release %q: %w", l.name, err)
	}
	s.c.logger.Warn("release failed; retrying in the background", "lock", l.name, "session", s.id, "err", err)
	s.keepTrying(func() error { return l.releaseToken(context.Background(), h.token) }, func() {})
	return fmt.Errorf("release %q: %w", l.name, err)
}

// maxRetention bounds a completion mark's retention (the server's limit).
const maxRetention = 400 * 24 * time.Hour

// complete sends Complete for the exclusive hold. Once the server has
// answered (or the lease is gone) the hold is over; after an unknown outcome
// the hold stays, so the caller may retry Complete or Unlock.
func (l *lock) complete(ctx context.Context, retention time.Duration) error {
	s := l.s
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	if h == nil || h.shared {
		return fmt.Errorf("complete %q: %w", l.name, ErrNotHeld)
	}
	if retention < time.Second || retention > maxRetention {
		return fmt.Errorf("complete %q: retention %v outside [1s, 400 days]: %w", l.name, retention, ErrInvalidArgument)
	}
	if err := s.live(); err != nil {
		return fmt.Errorf("complete %q: %w", l.name, err)
	}
	bctx, stop := s.bind(ctx)
	defer stop()
	seq := s.seqs.Begin()
	defer seq.End()
	msg := &lockdv1.CompleteRequest{
		SessionId: s.id, Secret: s.secret, Seq: seq.Seq, Ack: s.seqs.Ack(), Name: l.name, Token: h.token, Retention: durationpb.New(retention),
	}
	_, err := wire.Complete.Call(bctx, s.c.call, s.policy(wire.Complete.PolicyOf(msg)), msg)
	if errors.Is(err, ErrLeaseLost) {
		s.lose(err)
	}
	if err == nil || errors.Is(err, ErrNotHeld) || errors.Is(err, ErrLeaseLost) {
		// Done, or the hold is gone anyway. Any other refusal leaves the
		// hold in place: the caller can still Unlock.
		l.mu.Lock()
		if l.h == h {
			l.h = nil
			l.untrack()
		}
		l.mu.Unlock()
		h.end()
	}
	if err != nil {
		return fmt.Errorf("complete %q: %w", l.name, err)
	}
	return nil
}

func (l *lock) releaseToken(ctx context.Context, token uint64) error {
	s := l.s
	bctx, stop := s.bind(ctx)
	defer stop()
	seq := s.seqs.Begin()
	defer seq.End()
	msg := &lockdv1.ReleaseRequest{SessionId: s.id, Secret: s.secret, Seq: seq.Seq, Ack: s.seqs.Ack(), Name: l.name, Token: token}
	_, err := wire.Release.Call(bctx, s.c.call, s.policy(wire.Release.PolicyOf(msg)), msg)
	if errors.Is(err, ErrLeaseLost) {
		s.lose(err)
	}
	return err
}

func (l *lock) token() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil {
		return 0
	}
	return l.h.token
}

func (l *lock) context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.h
	if h == nil {
		return notHeldCtx
	}
	if h.ctx == nil {
		// A child of the session's: it ends when the session does, and at
		// the hold budget's client deadline if it has one.
		h.ctx, h.cancel = holdCtx(l.s.ctx, h.deadline)
	}
	return h.ctx
}

func (l *lock) err() error {
	ctx := l.context()
	if ctx.Err() == nil {
		if err := l.s.live(); err != nil {
			return err // past the deadline: the context is about to end
		}
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return ErrHoldExpired // the hold's budget: its context is about to end
		}
		return nil
	}
	return context.Cause(ctx)
}
