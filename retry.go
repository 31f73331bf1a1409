package lockd

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Backoff between failed attempts: exponential with full jitter.
const (
	backoffBase = 50 * time.Millisecond
	backoffCap  = 2 * time.Second
)

// backoff returns how long to wait after the attempt-th failed attempt
// (0-based): a uniformly random duration in [0, min(max, base·2^attempt)]
// ("full jitter"), so that many clients failing together do not retry
// together.
func backoff(attempt int, base, max time.Duration) time.Duration {
	d := max
	if attempt < 32 {
		if e := base << attempt; e > 0 && e < max {
			d = e
		}
	}
	return rand.N(d + 1)
}

// policy says how a call may be retried.
type policy struct {
	// idempotent calls carry a request id (or are reads), so a resend after
	// an unknown outcome is safe. Others are resent only when the server
	// surely did not take them.
	idempotent bool
	// timeout bounds each attempt; 0 means the client's request timeout.
	timeout time.Duration
	// once makes a single attempt (still rotating endpoints on failure):
	// the caller runs its own schedule, as the keepalive loop does.
	once bool
}

var (
	safe   = policy{idempotent: true}
	unsafe = policy{}
)

// do runs fn against endpoints until it succeeds, fails in a way that is
// not worth retrying, or ctx ends. Each attempt has its own timeout. Between
// attempts it waits with exponential backoff and full jitter, moving to the
// next endpoint after a transport error or an unavailable answer, or
// straight to the leader a server named. When ctx ends mid-retry, the error
// joins ctx.Err() and the last attempt's error. A ctx without a deadline
// stops retrying after the retry timeout.
func (c *Client) do(ctx context.Context, p policy, name string, fn func(context.Context, *endpoint) error) error {
	if c.isClosed() {
		return ErrClosed
	}
	timeout := p.timeout
	if timeout <= 0 {
		timeout = c.cfg.requestTimeout
	}
	var giveUp <-chan time.Time
	if _, ok := ctx.Deadline(); !ok && c.cfg.retryTimeout > 0 && !p.once {
		t := time.NewTimer(c.cfg.retryTimeout)
		defer t.Stop()
		giveUp = t.C
	}
	var lastErr error
	followed := false // the previous attempt went straight to a named leader
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return joinCtx(err, lastErr)
		}
		select {
		case <-giveUp:
			return lastErr
		default:
		}
		ep, err := c.pick()
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, timeout)
		err = fn(actx, ep)
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			if isContextErr(err) || connect.CodeOf(err) == connect.CodeCanceled || connect.CodeOf(err) == connect.CodeDeadlineExceeded {
				// The caller's time ran out during this attempt, not because
				// of an earlier failure: say only that (a --wait that ran out
				// is "busy", not "unavailable").
				return ctx.Err()
			}
			return joinCtx(ctx.Err(), mapError(err, name))
		}
		if timedOut {
			err = wrap(ErrUnavailable, errors.Join(errors.New("attempt timed out after "+timeout.String()+" at "+ep.url), err))
		}
		retry, hint := retryable(err, p.idempotent, timedOut)
		err = mapError(err, name)
		if !retry {
			return err
		}
		lastErr = err
		c.logger.Debug("call failed", "endpoint", ep.url, "attempt", attempt+1, "err", err)
		immediate := false
		if hint != "" {
			// Follow a leader hint at once, but not twice in a row: two
			// nodes naming each other during an election must not make a
			// tight loop.
			immediate = c.follow(ep, hint) && !followed
		} else {
			c.rotate(ep)
		}
		if errors.Is(err, ErrClusterMismatch) {
			immediate = true
		}
		followed = hint != "" && immediate
		if p.once && !(immediate && attempt == 0) {
			return err
		}
		if immediate {
			continue
		}
		t := time.NewTimer(backoff(attempt, backoffBase, backoffCap))
		select {
		case <-ctx.Done():
			t.Stop()
			return joinCtx(ctx.Err(), lastErr)
		case <-giveUp:
			t.Stop()
			return lastErr
		case <-t.C:
		}
	}
}

// joinCtx returns ctxErr, joined with cause when there is one.
func joinCtx(ctxErr, cause error) error {
	if cause == nil {
		return ctxErr
	}
	return errors.Join(ctxErr, cause)
}

// retryable reports whether a failed attempt may be retried under the given
// idempotency, and the leader the server named, if any.
func retryable(err error, idempotent, timedOut bool) (retry bool, hint string) {
	if errors.Is(err, ErrClusterMismatch) {
		// The other cluster's answer says nothing about ours.
		return true, ""
	}
	if d := errorDetail(err); d != nil {
		switch d.GetReason() {
		case lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER:
			// The node did not take the request.
			return true, d.GetLeaderApi()
		case lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN:
			return idempotent, ""
		default:
			return false, ""
		}
	}
	if timedOut {
		return idempotent, ""
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeCanceled:
		return idempotent || notSent(err), ""
	}
	return false, ""
}

// notSent reports whether err shows the request never reached a server.
func notSent(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}
