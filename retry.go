package lockd

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/retry"

	"github.com/lockd-dev/lockd/internal/wire"
)

// retrySchedule is the wait between failed attempts: exponential backoff
// with full jitter.
var retrySchedule = retry.Backoff{Base: 50 * time.Millisecond, Cap: 2 * time.Second}

// minAttempt is the shortest time an attempt is given, however little the
// caller's deadline or lease leaves: less could not even connect.
const minAttempt = 10 * time.Millisecond

// policy says how one call may be retried and how long its attempts may
// take.
type policy struct {
	// idempotent calls are deduplicated by the server, so a resend after an
	// unknown outcome is safe. Others are resent only when the server surely
	// did not take them.
	idempotent bool
	// timeout caps the request part of each attempt below the client's
	// request timeout; 0 means the request timeout.
	timeout time.Duration
	// poll is added to each attempt's time: the long poll the server may
	// block for before it answers.
	poll time.Duration
	// until, when set, returns a time past which no attempt's request part
	// runs: a session's lease deadline, after which an answer is useless.
	until func() time.Time
	// once makes a single attempt (still rotating endpoints on failure):
	// the caller runs its own schedule, as the keepalive loop does.
	once bool
	// abandon makes an attempt that times out (given its whole timeout)
	// while nothing came from the endpoint abandon it: a keepalive overdue
	// on a silent node means the node stopped answering (abandon.go).
	abandon bool
}

// do runs fn against endpoints until it succeeds, fails in a way that is
// not worth retrying, or ctx ends.
//
// It starts at the endpoint the last call succeeded on, or that a server
// named as leader (a random one at first), and skips endpoints that did not
// answer lately. Each attempt gets the request timeout, less when the
// caller's deadline (half of what is left, while another endpoint may be
// tried), the policy's lease or the connect budget leaves less. Between
// attempts it waits with exponential backoff and full jitter, moving to the
// next endpoint after a transport error or an unavailable answer, or
// straight to the leader a server named. When ctx ends mid-retry, the error
// joins ctx.Err() and the last attempt's error. A ctx without a deadline
// stops retrying after the retry timeout; while no endpoint has answered at
// all, the call stops after the connect timeout, if one is set, or after
// refusedFor when every endpoint refused the connection and no server ever
// answered this Client. A refused endpoint is left for the next at once; an
// endpoint whose connection ended without HTTP is probed, and one that
// does not speak HTTP is named and passed over (dial.go).
func (c *Client) do(ctx context.Context, p policy, name string, fn func(context.Context, *wire.Node) error) error {
	if c.isClosed() {
		return ErrClosed
	}
	r := retry.New(ctx, retrySchedule)
	if !p.once {
		r.GiveUpAfter(c.cfg.retryTimeout)
		defer r.Stop()
	}
	start := time.Now()
	answered := false                 // some endpoint answered this call
	followed := false                 // the previous attempt went straight to a named leader
	brokeBefore := false              // the previous attempt's stream broke
	refused := map[*wire.Node]error{} // endpoints that refused the connection in this call
	for r.Next() {
		connectLeft := time.Duration(-1)
		if !answered && c.cfg.connectTimeout > 0 {
			if connectLeft = c.cfg.connectTimeout - time.Since(start); connectLeft <= 0 {
				break
			}
		}
		ep, others, err := c.eps.Pick()
		if err != nil {
			return err
		}
		timeout := c.attemptTimeout(ctx, p, others, connectLeft)
		actx, cancel := context.WithTimeout(ctx, timeout)
		sent := wire.MonoNow()
		err = fn(actx, ep)
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil {
			c.eps.Answered(ep)
			return nil
		}
		if ctx.Err() != nil {
			if all, never := c.eps.RefusedAll(refused); all && never && !answered {
				// Every endpoint refused so far, and the caller's time ran
				// out during one more attempt: nothing listens, whichever
				// of the two ended first (lockd run --wait 1s against a
				// stopped server is "unavailable", not "busy").
				return retry.JoinCtx(ctx.Err(), c.eps.RefusedErr(refused))
			}
			if isContextErr(err) || connect.CodeOf(err) == connect.CodeCanceled || connect.CodeOf(err) == connect.CodeDeadlineExceeded {
				// The caller's time ran out during this attempt, not because
				// of an earlier failure: say only that (a --wait that ran out
				// is "busy", not "unavailable").
				return ctx.Err()
			}
			return retry.JoinCtx(ctx.Err(), mapError(err, name))
		}
		// A node that sent anything during the attempt (another call's
		// answer, an HTTP/2 ping reply) is slow, not frozen: keep it,
		// and only this attempt fails.
		abandoned := timedOut && p.abandon && timeout >= p.timeout && !c.heardFrom(ep, sent)
		if abandoned {
			c.abandon(ep, timeout)
		} else if timedOut && p.abandon {
			c.logger.Debug("keepalive overdue, but the endpoint still sends: kept", "endpoint", ep.URL, "after", timeout)
		}
		if timedOut {
			err = wrap(ErrUnavailable, errors.Join(errors.New("attempt timed out after "+timeout.String()+" at "+ep.URL), err))
		}
		if !timedOut && c.eps.MayProbe(ep, err) && c.probe(ctx, ep) {
			// Not a failed lockd server but another service: say so
			// now, and use the other endpoints, if any.
			nerr := c.eps.MarkNotAPI(ep, mapError(err, name))
			if _, _, perr := c.eps.Pick(); perr != nil || p.once {
				return nerr
			}
			r.Fail(nerr)
			r.Now()
			continue
		}
		if wire.IsRefused(err) {
			refused[ep] = err
		}
		if timedOut || wire.Unanswered(err) {
			c.eps.Silent(ep)
		} else {
			answered = true
			if !wire.TLSRefused(err) {
				c.eps.Answered(ep)
			}
		}
		ok, hint := wire.Retryable(err, p.idempotent, timedOut)
		electing := hint == "" && wire.ElectionUnderWay(err)
		broken := errors.Is(err, wire.ErrStreamBroken) || abandoned
		err = mapError(err, name)
		immediate := false
		if hint != "" {
			// Follow a leader hint at once, but not twice in a row: two
			// nodes naming each other during an election must not make a
			// tight loop.
			immediate = c.eps.Follow(ep, hint) && !followed
		} else if ok {
			c.eps.Rotate(ep)
		}
		if !ok {
			return err
		}
		r.Fail(err)
		c.logger.Debug("call failed", "endpoint", ep.URL, "attempt", r.Attempt()+1, "err", err)
		if errors.Is(err, ErrClusterMismatch) {
			immediate = true
		}
		if broken && !brokeBefore && hint == "" {
			// The node or its connection is gone: try the next endpoint
			// now, once (a stream that breaks again waits its turn).
			immediate = true
		}
		// A refused connection costs nothing: try an endpoint that has
		// not refused in this call at once. When every one refused and no
		// server ever answered this Client, nothing listens: with a
		// connect timeout, stop after refusedFor.
		allRefused, neverSpoke := c.eps.RefusedAll(refused)
		fast := allRefused && neverSpoke && c.cfg.connectTimeout > 0 && !answered
		if wire.IsRefused(err) && !allRefused && hint == "" {
			immediate = true
		}
		if fast && time.Since(start) >= refusedFor {
			return c.eps.RefusedErr(refused)
		}
		brokeBefore = broken
		followed = hint != "" && immediate
		if p.once && !(immediate && r.Attempt() == 0) {
			return err
		}
		if immediate {
			r.Now()
		} else if electing {
			// A live node says there is no leader: an election is under
			// way and ends within about an election timeout. Ask again
			// within electionPoll rather than back off for seconds, so a
			// failover costs the election, not the election plus the
			// backoff grown meanwhile.
			r.AtMost(electionPoll)
		} else if connectLeft > 0 && !answered {
			left := c.cfg.connectTimeout - time.Since(start)
			if fast {
				left = min(left, refusedFor-time.Since(start))
			}
			r.AtMost(max(left, time.Nanosecond))
		}
	}
	if ctx.Err() == nil && len(refused) > 0 {
		if all, _ := c.eps.RefusedAll(refused); all {
			return c.eps.RefusedErr(refused)
		}
	}
	return r.Err()
}

// electionPoll bounds the wait before asking again while a live node
// answers that there is no leader (an election takes an election timeout
// or two: 0.4–0.8 s at the server's defaults). The wait is still the
// backoff's full-jitter draw, only capped at it, so clients that failed
// together mostly do not ask together.
const electionPoll = 200 * time.Millisecond

// attemptTimeout returns how long the next attempt may take.
func (c *Client) attemptTimeout(ctx context.Context, p policy, others bool, connectLeft time.Duration) time.Duration {
	d := c.cfg.requestTimeout
	if p.timeout > 0 {
		d = min(d, p.timeout)
	}
	if p.until != nil {
		d = min(d, time.Until(p.until()))
	}
	if dl, ok := ctx.Deadline(); ok && others {
		// Leave time for another endpoint if this one hangs.
		d = min(d, time.Until(dl)/2)
	}
	if connectLeft >= 0 {
		d = min(d, connectLeft)
	}
	return max(d, minAttempt) + p.poll
}
