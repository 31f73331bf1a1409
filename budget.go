package lockd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd-dev/lockd/internal/lease"
)

// ErrHoldExpired means a hold's budget ran out (WithMaxHold, the lock's
// policy, or the caller's ceiling on the server): the client stopped
// believing in the hold, before the server may end it and grant the lock to
// the next waiter. A lock's Context ends with it as its cause.
var ErrHoldExpired = errors.New("lockd: hold budget ran out")

// minMaxHold is the smallest budget WithMaxHold accepts: below it the
// client's safety margin (at least 100 ms) leaves almost nothing.
const minMaxHold = time.Second

// maxMaxHold is the largest hold budget the server accepts (30 days).
const maxMaxHold = 720 * time.Hour

// WithMaxHold asks the server to end every hold the lock takes after d
// (1 s to 720 h), even while the session stays alive: a holder that is
// alive but stuck cannot keep the lock forever. The server ends the hold as
// an expiry ends it (lock-delay, next waiter granted, the token fenced by
// the next grant). The grant's budget may be shorter than d (the caller's
// ceiling on the server); the lock's Deadline and Context follow the budget
// the server granted. Without it, the lock's policy on the server may still
// set a default budget.
func WithMaxHold(d time.Duration) LockOption {
	return func(c *lockConfig) error {
		if d < minMaxHold || d > maxMaxHold {
			return fmt.Errorf("%w: max hold %v out of bounds [%v, %v]", ErrInvalidArgument, d, minMaxHold, maxMaxHold)
		}
		c.maxHold = d
		return nil
	}
}

// holdDeadline is the client's end of a hold's budget: the lease rule's
// client half, counted from sent, the send time of a call known to precede
// the grant. Zero without a budget.
func holdDeadline(sent time.Time, budget time.Duration) time.Time {
	if budget <= 0 {
		return time.Time{}
	}
	return lease.ClientHoldDeadline(sent, budget)
}

// holdCtx returns the context of a hold under parent: with a deadline dl
// (non-zero), it also ends then, with ErrHoldExpired as its cause.
func holdCtx(parent context.Context, dl time.Time) (context.Context, context.CancelCauseFunc) {
	if dl.IsZero() {
		return context.WithCancelCause(parent)
	}
	dctx, stop := context.WithDeadlineCause(parent, dl, ErrHoldExpired)
	ctx, cancel := context.WithCancelCause(dctx)
	return ctx, func(err error) { cancel(err); stop() }
}

// holdContext returns the context of a new hold under parent and its
// client deadline (holdDeadline, holdCtx).
func holdContext(parent context.Context, sent time.Time, budget time.Duration) (context.Context, context.CancelCauseFunc, time.Time) {
	dl := holdDeadline(sent, budget)
	ctx, cancel := holdCtx(parent, dl)
	return ctx, cancel, dl
}

// deadline returns until when the hold may be believed: the earlier of the
// session's lease deadline and the hold's budget deadline; zero when not
// held.
func (l *lock) deadline() time.Time {
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	if h == nil {
		return time.Time{}
	}
	dl := l.s.Deadline()
	if !h.deadline.IsZero() && h.deadline.Before(dl) {
		dl = h.deadline
	}
	return dl
}

// Deadline returns until when the current hold may be believed: the
// earlier of the session's lease deadline and the hold's budget deadline
// (see WithMaxHold). Zero when not held. Work under the lock must end
// before it; the lock's Context ends at it.
func (m *Mutex) Deadline() time.Time { return m.l.deadline() }

// Deadline returns until when the current hold may be believed (see
// Mutex.Deadline). Zero when not held.
func (m *Semaphore) Deadline() time.Time { return m.l.deadline() }

// Deadline returns until when the current hold, read or write, may be
// believed (see Mutex.Deadline). Zero when not held.
func (m *RWMutex) Deadline() time.Time { return m.l.deadline() }
