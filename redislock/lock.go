package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/retry"
)

// A hold confirmed by a request first sent at sent is given up at lockd's
// client deadline (docs/design.md), lease.ClientDeadline: sent + TTL·(1 − 1 %) −
// max(100 ms, 2 % TTL), and never later than the Redlock validity end
// sent + TTL − (TTL·1 % + 2 ms). Redis set the key's expiry when it
// received the request, after sent, so the client gives up strictly before
// the key can expire (given the client's clock runs at most 1 % slow
// against the server's).
const (
	driftConst   = 2 * time.Millisecond
	maxNameBytes = 512
)

// waitSchedule is the wait between tries for a busy lock: exponential
// backoff with full jitter, capped by the holder's remaining TTL and cut
// short by a release notification.
var waitSchedule = retry.Backoff{Base: 10 * time.Millisecond, Cap: time.Second}

// holdDeadline returns the client-side end of a hold confirmed by a request
// first sent at sent.
func holdDeadline(sent time.Time, ttl time.Duration) time.Time {
	deadline := lease.ClientDeadline(sent, ttl)
	validity := sent.Add(ttl - drift(ttl))
	if validity.Before(deadline) {
		return validity
	}
	return deadline
}

// drift is Redlock's allowance for clock drift between client and servers.
func drift(ttl time.Duration) time.Duration { return lease.Drift(ttl) + driftConst }

// newOwner returns a random 128-bit owner value.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

// validateName applies lockd's lock name rules: UTF-8, 1 to 512 bytes, no
// control characters.
func validateName(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: redislock: lock name %q: %s", lockd.ErrInvalidArgument, name, why)
	}
	switch {
	case name == "":
		return bad("empty")
	case len(name) > maxNameBytes:
		return bad(fmt.Sprintf("%d bytes, more than %d", len(name), maxNameBytes))
	case !utf8.ValidString(name):
		return bad("not valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return bad(fmt.Sprintf("control character %U", r))
		}
	}
	return nil
}

// store is one backend's operations on one lock, each a single attempt.
type store interface {
	// acquire tries once to take the lock for owner. granted false with a
	// nil error means busy; wait then hints how long until the holder's key
	// expires (0 if unknown). An error matching ErrLimitMismatch,
	// ErrInvalidArgument or ErrNoQuorum is definitive (nothing is left
	// behind); any other error leaves the outcome unknown.
	acquire(ctx context.Context, owner string) (granted bool, token uint64, wait time.Duration, err error)
	// extend renews owner's hold for another TTL: nil, errGone, or an error
	// with an unknown outcome.
	extend(ctx context.Context, owner string) error
	// release deletes owner's hold: nil, errGone, or an error with an
	// unknown outcome.
	release(ctx context.Context, owner string) error
	// channel is the pub/sub channel a release notifies, or "".
	channel() string
}

// owner is what a lock handle needs from its Client or Redlock.
type backend struct {
	cfg  config
	wake *waker // nil: no pub/sub

	mu     sync.Mutex
	holds  map[*lock]struct{}
	closed bool
}

func newBackend(cfg config) *backend {
	return &backend{cfg: cfg, holds: map[*lock]struct{}{}}
}

func (b *backend) logger() *slog.Logger { return b.cfg.logger }

// keys returns the key names of a lock.
func (b *backend) keys(name string) (lock, token, meta, channel string) {
	base := b.cfg.prefix + "{" + name + "}"
	return base, base + ":token", base + ":meta", base + ":released"
}

func (b *backend) add(l *lock) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("redislock: %w", lockd.ErrClosed)
	}
	b.holds[l] = struct{}{}
	return nil
}

func (b *backend) remove(l *lock) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.holds, l)
}

// close releases every hold (best effort, within ctx) and refuses new ones.
func (b *backend) close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	ls := make([]*lock, 0, len(b.holds))
	for l := range b.holds {
		ls = append(ls, l)
	}
	b.mu.Unlock()
	var errs []error
	for _, l := range ls {
		if err := l.release(ctx); err != nil && !errors.Is(err, lockd.ErrNotHeld) && !errors.Is(err, lockd.ErrLeaseLost) {
			errs = append(errs, err)
		}
	}
	if b.wake != nil {
		errs = append(errs, b.wake.close())
	}
	return errors.Join(errs...)
}

// notHeldCtx is the Context of a lock that is not held.
var notHeldCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(lockd.ErrNotHeld)
	return ctx
}()

// lock is the machinery shared by Mutex and Semaphore on both backends:
// one hold at a time, renewed by a watchdog, lost at the client deadline.
type lock struct {
	b    *backend
	st   store
	name string
	err  error // a bad name

	mu   sync.Mutex
	busy bool  // an acquire is in flight
	h    *hold // nil when not held
}

// hold is one grant.
type hold struct {
	owner  string
	token  uint64
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the watchdog has exited

	mu       sync.Mutex
	deadline time.Time
	timer    *time.Timer // fires at deadline
}

func newLock(b *backend, name string, st store) *lock {
	return &lock{b: b, st: st, name: name, err: validateName(name)}
}

// acquire takes the lock; with wait it retries until granted or ctx ends.
func (l *lock) acquire(ctx context.Context, wait bool) error {
	if l.err != nil {
		return l.err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	if l.h != nil || l.busy {
		l.mu.Unlock()
		return fmt.Errorf("redislock: acquire %q: %w", l.name, lockd.ErrAlreadyHeld)
	}
	l.busy = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.busy = false
		l.mu.Unlock()
	}()

	var wake <-chan struct{}
	if wait && l.b.wake != nil {
		if ch := l.st.channel(); ch != "" {
			w, stop := l.b.wake.watch(ch)
			defer stop()
			wake = w
		}
	}
	ttl := l.b.cfg.ttl
	r := retry.New(ctx, waitSchedule).WakeOn(wake)
	for r.Next() {
		owner := newOwner()
		sent := time.Now()
		granted, token, hint, err := l.st.acquire(ctx, owner)
		var failed error
		switch {
		case err == nil && granted:
			if !time.Now().Before(holdDeadline(sent, ttl)) {
				// Granted too late to use: give it back and try again.
				l.cleanup(ctx, owner)
				failed = fmt.Errorf("redislock: acquire %q: %w: grant confirmed after its client deadline", l.name, lockd.ErrUnavailable)
				break
			}
			return l.granted(owner, token, sent)
		case err == nil:
			failed = busyError(l.name, busyDetail(hint))
			r.AtMost(hint)
		case errors.Is(err, lockd.ErrLimitMismatch), errors.Is(err, lockd.ErrInvalidArgument):
			return fmt.Errorf("redislock: acquire %q: %w", l.name, err)
		default:
			if !errors.Is(err, ErrNoQuorum) {
				l.cleanup(ctx, owner)
			}
			failed = fmt.Errorf("redislock: acquire %q: %w", l.name, err)
		}
		if !wait && ctx.Err() == nil {
			return failed
		}
		r.Fail(failed)
	}
	return r.Err()
}

func busyDetail(hint time.Duration) string {
	if hint <= 0 {
		return ""
	}
	return "expires in at most " + hint.Round(time.Millisecond).String()
}

// cleanup deletes owner's key after an acquire with an unknown outcome, so
// that a grant nobody knows of does not block others until it expires.
func (l *lock) cleanup(ctx context.Context, owner string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.b.cfg.timeout)
	defer cancel()
	if err := l.st.release(cctx, owner); err != nil && !errors.Is(err, errGone) {
		l.b.logger().Warn("cleanup of uncertain acquire failed; the key expires by its TTL", "lock", l.name, "err", err)
	}
}

// granted installs a hold and starts its watchdog.
func (l *lock) granted(owner string, token uint64, sent time.Time) error {
	h := &hold{owner: owner, token: token, done: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancelCause(context.Background())
	h.deadline = holdDeadline(sent, l.b.cfg.ttl)
	if err := l.b.add(l); err != nil {
		l.cleanup(context.Background(), owner)
		return err
	}
	l.mu.Lock()
	l.h = h
	l.mu.Unlock()
	h.mu.Lock()
	h.timer = time.AfterFunc(time.Until(h.deadline), func() { l.expire(h) })
	h.mu.Unlock()
	go l.watchdog(h, sent)
	l.b.logger().Debug("lock granted", "lock", l.name, "token", token)
	return nil
}

// lose ends a hold with a lease-loss cause (unless it already ended).
func (l *lock) lose(h *hold, why string) {
	if h.ctx.Err() != nil {
		return
	}
	h.cancel(fmt.Errorf("%w: redislock: lock %q: %s", lockd.ErrLeaseLost, l.name, why))
	l.b.logger().Warn("lock lost", "lock", l.name, "why", why)
}

// expire runs at the hold's deadline.
func (l *lock) expire(h *hold) {
	h.mu.Lock()
	if d := time.Until(h.deadline); d > 0 {
		h.timer.Reset(d) // a renewal moved the deadline after the timer fired
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	l.lose(h, "no renewal confirmed before the client deadline")
}

// confirm moves the deadline after a renewal first sent at sent succeeded.
// A confirmation at or after the current deadline does not revive the hold.
func (l *lock) confirm(h *hold, sent time.Time) bool {
	h.mu.Lock()
	now := time.Now()
	if !now.Before(h.deadline) {
		h.mu.Unlock()
		l.lose(h, "renewal confirmed after the client deadline")
		return false
	}
	if d := holdDeadline(sent, l.b.cfg.ttl); d.After(h.deadline) {
		h.deadline = d
		h.timer.Reset(d.Sub(now))
	}
	h.mu.Unlock()
	return true
}

// watchdog renews the hold every TTL/3 (every TTL/10 after a failure)
// until it ends.
func (l *lock) watchdog(h *hold, sent time.Time) {
	defer close(h.done)
	ttl := l.b.cfg.ttl
	next := sent.Add(lease.RenewInterval(ttl))
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-h.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		h.mu.Lock()
		left := time.Until(h.deadline)
		h.mu.Unlock()
		sent := time.Now()
		ctx, cancel := context.WithTimeout(h.ctx, max(min(l.b.cfg.timeout, left), time.Millisecond))
		err := l.st.extend(ctx, h.owner)
		cancel()
		switch {
		case h.ctx.Err() != nil:
			return
		case err == nil:
			if !l.confirm(h, sent) {
				return
			}
			next = sent.Add(lease.RenewInterval(ttl))
		case errors.Is(err, errGone):
			l.lose(h, "renewal found the key gone or owned by another (expired, evicted or flushed)")
			return
		default:
			l.b.logger().Warn("lock renewal failed", "lock", l.name, "err", err)
			next = time.Now().Add(lease.JeopardyInterval(ttl))
		}
	}
}

// release gives up the hold. The hold's context is cancelled before Redis
// is asked, so work under it stops before the next holder may start.
func (l *lock) release(ctx context.Context) error {
	l.mu.Lock()
	h := l.h
	l.h = nil
	l.mu.Unlock()
	if h == nil {
		return fmt.Errorf("redislock: release %q: %w", l.name, lockd.ErrNotHeld)
	}
	defer l.b.remove(l)
	lost := context.Cause(h.ctx)
	h.cancel(lockd.ErrNotHeld)
	h.mu.Lock()
	h.timer.Stop()
	h.mu.Unlock()
	<-h.done
	// Even a lost hold's key is deleted if it is still ours (Redis was
	// slow, not gone): compare-and-delete never frees another owner's key.
	err := l.st.release(ctx, h.owner)
	switch {
	case lost != nil:
		return fmt.Errorf("redislock: release %q: %w", l.name, lost)
	case err == nil:
		return nil
	case errors.Is(err, errGone):
		return fmt.Errorf("redislock: release %q: %w: the key was gone or owned by another before release", l.name, lockd.ErrLeaseLost)
	default:
		return fmt.Errorf("redislock: release %q: %w (the key expires by its TTL)", l.name, err)
	}
}

func (l *lock) current() *hold {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h
}

func (l *lock) token() uint64 {
	if h := l.current(); h != nil {
		return h.token
	}
	return 0
}

func (l *lock) context() context.Context {
	if h := l.current(); h != nil {
		return h.ctx
	}
	return notHeldCtx
}

func (l *lock) errNow() error {
	ctx := l.context()
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}

func (l *lock) deadline() time.Time {
	h := l.current()
	if h == nil {
		return time.Time{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}
