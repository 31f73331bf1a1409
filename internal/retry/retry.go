package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential backoff schedule with full jitter: the wait
// after the n-th failed attempt (0-based) is uniformly random in
// [0, min(Cap, Base·2^n)], so that many clients failing together do not
// retry together.
type Backoff struct {
	// Base is the ceiling of the first wait.
	Base time.Duration
	// Cap is the largest ceiling of any wait.
	Cap time.Duration
}

// Delay returns the wait after the attempt-th failed attempt (0-based).
func (b Backoff) Delay(attempt int) time.Duration {
	d := b.Cap
	if attempt < 32 {
		if e := b.Base << attempt; e > 0 && e < b.Cap {
			d = e
		}
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// Retrier runs the attempts of one call:
//
//	r := retry.New(ctx, b)
//	for r.Next() {
//		err := try()
//		if err == nil {
//			return nil
//		}
//		if permanent(err) {
//			return err
//		}
//		r.Fail(err)
//	}
//	return r.Err()
//
// Next waits before every attempt but the first, unless the previous one
// asked for none (Now). It returns false when ctx ends or the retrier's own
// time limit (GiveUpAfter) passes. A Retrier is used by one goroutine.
type Retrier struct {
	ctx      context.Context
	b        Backoff
	attempt  int // attempts started
	last     error
	now      bool          // next attempt without waiting
	ceiling  time.Duration // > 0: the next wait is at most this
	wake     <-chan struct{}
	giveUpAt time.Time // zero: no limit of the retrier's own
	gaveUp   bool
}

// New returns a Retrier for one call bounded by ctx.
func New(ctx context.Context, b Backoff) *Retrier {
	return &Retrier{ctx: ctx, b: b}
}

// GiveUpAfter makes Next return false once d has passed, when ctx has no
// deadline of its own (a deadline always bounds the retries by itself): a
// call with no deadline must still end. d <= 0 sets no limit. The limit
// is a time, not a timer: a call that succeeds at once (most do) pays for
// no timer.
func (r *Retrier) GiveUpAfter(d time.Duration) *Retrier {
	if _, ok := r.ctx.Deadline(); ok || d <= 0 {
		return r
	}
	r.giveUpAt = time.Now().Add(d)
	return r
}

// WakeOn makes a receive from ch cut a wait short (a release notification,
// for example).
func (r *Retrier) WakeOn(ch <-chan struct{}) *Retrier {
	r.wake = ch
	return r
}

// Stop ends the retrier's use. It holds no timer between waits, so there
// is nothing to release; callers keep calling it so that a retrier that
// ever holds one again releases it.
func (r *Retrier) Stop() {}

// Next waits as the schedule says and reports whether another attempt may
// start: false once ctx ended or the retrier gave up.
func (r *Retrier) Next() bool {
	if r.ctx.Err() != nil || r.gaveUp {
		return false
	}
	if !r.giveUpAt.IsZero() && !time.Now().Before(r.giveUpAt) {
		r.gaveUp = true
		return false
	}
	if r.attempt > 0 && !r.now {
		d := r.b.Delay(r.attempt - 1)
		if r.ceiling > 0 && r.ceiling < d {
			d = r.ceiling
		}
		// A wait that would outlast the limit ends at it, giving up.
		last := false
		if !r.giveUpAt.IsZero() {
			if left := time.Until(r.giveUpAt); left <= d {
				d, last = left, true
			}
		}
		t := time.NewTimer(d)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return false
		case <-r.wake:
			t.Stop()
			if last && !time.Now().Before(r.giveUpAt) {
				r.gaveUp = true
				return false
			}
		case <-t.C:
			if last {
				r.gaveUp = true
				return false
			}
		}
	}
	r.now, r.ceiling = false, 0
	r.attempt++
	return true
}

// Attempt returns the number of the current attempt, from 0.
func (r *Retrier) Attempt() int { return r.attempt - 1 }

// Fail records err as the cause of the current attempt's failure.
func (r *Retrier) Fail(err error) { r.last = err }

// Now makes the next attempt start without waiting (say, straight to a
// leader a server named).
func (r *Retrier) Now() { r.now = true }

// AtMost caps the next wait at d (say, a lock holder's remaining TTL).
func (r *Retrier) AtMost(d time.Duration) {
	if d > 0 {
		r.ceiling = d
	}
}

// Last returns the cause recorded by the last Fail.
func (r *Retrier) Last() error { return r.last }

// Err returns why the retries ended: ctx's error joined with the last
// attempt's cause when ctx ended, or the last cause alone when the retrier
// gave up on its own time limit.
func (r *Retrier) Err() error {
	if err := r.ctx.Err(); err != nil {
		return JoinCtx(err, r.last)
	}
	return r.last
}

// JoinCtx returns ctxErr joined with cause, or ctxErr alone when there is
// no cause: a call cut short mid-retry says both why it stopped and what
// failed before.
func JoinCtx(ctxErr, cause error) error {
	if cause == nil {
		return ctxErr
	}
	return errors.Join(ctxErr, cause)
}
