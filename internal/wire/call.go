package wire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/retry"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Caller runs calls against the endpoints: the retry loop (Do) with its
// probes of endpoints that do not speak the API and its abandoning of
// nodes that stopped answering.
type Caller struct {
	Eps   *Endpoints
	Conns *ConnTracker // the own transports' connections; nil with a caller's HTTP client
	H1    *http.Client // HTTP/1.1, for probes
	// RequestTimeout bounds one attempt, RetryTimeout a call whose ctx has
	// no deadline, ConnectTimeout (0: none) a call while no endpoint has
	// answered.
	RequestTimeout, RetryTimeout, ConnectTimeout time.Duration
	Logger                                       *slog.Logger
	// MapError turns an error of the API into the client's sentinels; name
	// is the lock concerned, if any.
	MapError func(err error, name string) error
	// Closed reports whether the client was closed: calls then fail with
	// ErrClosed.
	Closed func() bool
	// Stream says the session stream is on: the methods a frame carries go
	// over it, else every call is unary.
	Stream bool
	// OnNotice receives the release-request notices of the client's
	// streams (call_id 0 frames, after a SubscribeNotices); it is called
	// from a stream's reader and must not block. nil: dropped.
	OnNotice func(*lockdv1.ReleaseRequested)
}

// ErrClosed means the client was closed (lockd.ErrClosed).
var ErrClosed = errors.New("lockd: client closed")

// IsContextErr reports whether err is a context's cancellation or
// deadline.
func IsContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// kindError marks an error as one of the sentinels while keeping the
// server's message.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string {
	msg := e.err.Error()
	var ce *connect.Error
	if errors.As(e.err, &ce) && ce.Message() != "" {
		msg = ce.Message()
	}
	return e.kind.Error() + ": " + msg
}

func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// unavailable marks err as ErrUnavailable unless it already is.
func unavailable(err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return &kindError{kind: ErrUnavailable, err: err}
}

// Probing tells a port that is not lockd's API from a server that failed,
// so that a client pointed at the wrong port (the Raft port, most often),
// or at a port where nothing listens, is told so at once instead of
// retrying for its whole timeout.

// Abandoning a node that stopped answering. A frozen node (SIGSTOP, a
// hung host) keeps its TCP connections open: nothing breaks, so calls
// waiting on its session stream (a queued Acquire's long poll, a Release)
// would wait out their whole attempt timeout, and the lock with them. The
// keepalives notice first: they are due every TTL/3 and bounded by a short
// attempt timeout (keepaliveTimeout). A keepalive attempt that gets no
// answer within it abandons the endpoint: its stream fails (every pending
// call gets the "outcome unknown" error the retry loop re-sends with the
// same seq, on the next endpoint or to a leader hint, as after a broken
// stream) and the client's connections to it are closed, so unary calls
// waiting on it fail too. The lease rule does not move: a re-sent call
// keeps its first attempt's send time and its (session, seq).

// RetrySchedule is the wait between failed attempts: exponential backoff
// with full jitter.
var RetrySchedule = retry.Backoff{Base: 50 * time.Millisecond, Cap: 2 * time.Second}

// minAttempt is the shortest time an attempt is given, however little the
// caller's deadline or lease leaves: less could not even connect.
const minAttempt = 10 * time.Millisecond

// Policy says how one call may be retried and how long its attempts may
// take.
type Policy struct {
	// Idempotent calls are deduplicated by the server, so a resend after an
	// unknown outcome is safe. Others are resent only when the server surely
	// did not take them.
	Idempotent bool
	// Timeout caps the request part of each attempt below the client's
	// request timeout; 0 means the request timeout.
	Timeout time.Duration
	// Poll is added to each attempt's time: the long poll the server may
	// block for before it answers.
	Poll time.Duration
	// Until, when set, returns a time past which no attempt's request part
	// runs: a session's lease deadline, after which an answer is useless.
	Until func() time.Time
	// Once makes a single attempt (still rotating endpoints on failure):
	// the caller runs its own schedule, as the keepalive loop does.
	Once bool
	// Abandon makes an attempt that times out (given its whole timeout)
	// while nothing came from the endpoint abandon it: a keepalive overdue
	// on a silent node means the node stopped answering (abandon).
	Abandon bool
}

// Do runs fn against endpoints until it succeeds, fails in a way that is
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
// does not speak HTTP is named and passed over (probe).
func (c *Caller) Do(ctx context.Context, p Policy, name string, fn func(context.Context, *Node) error) error {
	if c.Closed() {
		return ErrClosed
	}
	r := retry.New(ctx, RetrySchedule)
	if !p.Once {
		r.GiveUpAfter(c.RetryTimeout)
		defer r.Stop()
	}
	start := time.Now()
	answered := false           // some endpoint answered this call
	followed := false           // the previous attempt went straight to a named leader
	brokeBefore := false        // the previous attempt's stream broke
	var refused map[*Node]error // endpoints that refused the connection in this call (made at the first)
	for r.Next() {
		connectLeft := time.Duration(-1)
		if !answered && c.ConnectTimeout > 0 {
			if connectLeft = c.ConnectTimeout - time.Since(start); connectLeft <= 0 {
				break
			}
		}
		ep, others, err := c.Eps.Pick()
		if err != nil {
			return err
		}
		timeout := c.attemptTimeout(ctx, p, others, connectLeft)
		actx, cancel := context.WithTimeout(ctx, timeout)
		sent := MonoNow()
		err = fn(actx, ep)
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil {
			c.Eps.Answered(ep)
			return nil
		}
		if ctx.Err() != nil {
			if all, never := c.Eps.RefusedAll(refused); all && never && !answered {
				// Every endpoint refused so far, and the caller's time ran
				// out during one more attempt: nothing listens, whichever
				// of the two ended first (lockd run --wait 1s against a
				// stopped server is "unavailable", not "busy").
				return retry.JoinCtx(ctx.Err(), c.Eps.RefusedErr(refused))
			}
			if IsContextErr(err) || connect.CodeOf(err) == connect.CodeCanceled || connect.CodeOf(err) == connect.CodeDeadlineExceeded {
				// The caller's time ran out during this attempt, not because
				// of an earlier failure: say only that (a --wait that ran out
				// is "busy", not "unavailable").
				return ctx.Err()
			}
			return retry.JoinCtx(ctx.Err(), c.MapError(err, name))
		}
		// A node that sent anything during the attempt (another call's
		// answer, an HTTP/2 ping reply) is slow, not frozen: keep it,
		// and only this attempt fails.
		abandoned := timedOut && p.Abandon && timeout >= p.Timeout && !c.heardFrom(ep, sent)
		if abandoned {
			c.abandon(ep, timeout)
		} else if timedOut && p.Abandon {
			c.Logger.Debug("keepalive overdue, but the endpoint still sends: kept", "endpoint", ep.URL, "after", timeout)
		}
		if timedOut {
			err = unavailable(errors.Join(errors.New("attempt timed out after "+timeout.String()+" at "+ep.URL), err))
		}
		if !timedOut && c.Eps.MayProbe(ep, err) && c.probe(ctx, ep) {
			// Not a failed lockd server but another service: say so
			// now, and use the other endpoints, if any.
			nerr := c.Eps.MarkNotAPI(ep, c.MapError(err, name))
			if _, _, perr := c.Eps.Pick(); perr != nil || p.Once {
				return nerr
			}
			r.Fail(nerr)
			r.Now()
			continue
		}
		if IsRefused(err) {
			if refused == nil {
				refused = map[*Node]error{}
			}
			refused[ep] = err
		}
		if timedOut || Unanswered(err) {
			c.Eps.Silent(ep)
		} else {
			answered = true
			if !TLSRefused(err) {
				c.Eps.Answered(ep)
			}
		}
		ok, hint := Retryable(err, p.Idempotent, timedOut)
		electing := hint == "" && ElectionUnderWay(err)
		broken := errors.Is(err, ErrStreamBroken) || abandoned
		err = c.MapError(err, name)
		immediate := false
		if hint != "" {
			// Follow a leader hint at once, but not twice in a row: two
			// nodes naming each other during an election must not make a
			// tight loop.
			immediate = c.Eps.Follow(ep, hint) && !followed
		} else if ok {
			c.Eps.Rotate(ep)
		}
		if !ok {
			return err
		}
		r.Fail(err)
		c.Logger.Debug("call failed", "endpoint", ep.URL, "attempt", r.Attempt()+1, "err", err)
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
		allRefused, neverSpoke := c.Eps.RefusedAll(refused)
		fast := allRefused && neverSpoke && c.ConnectTimeout > 0 && !answered
		if IsRefused(err) && !allRefused && hint == "" {
			immediate = true
		}
		if fast && time.Since(start) >= refusedFor {
			return c.Eps.RefusedErr(refused)
		}
		brokeBefore = broken
		followed = hint != "" && immediate
		if p.Once && !(immediate && r.Attempt() == 0) {
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
			left := c.ConnectTimeout - time.Since(start)
			if fast {
				left = min(left, refusedFor-time.Since(start))
			}
			r.AtMost(max(left, time.Nanosecond))
		}
	}
	if ctx.Err() == nil && len(refused) > 0 {
		if all, _ := c.Eps.RefusedAll(refused); all {
			return c.Eps.RefusedErr(refused)
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
func (c *Caller) attemptTimeout(ctx context.Context, p Policy, others bool, connectLeft time.Duration) time.Duration {
	d := c.RequestTimeout
	if p.Timeout > 0 {
		d = min(d, p.Timeout)
	}
	if p.Until != nil {
		d = min(d, time.Until(p.Until()))
	}
	if dl, ok := ctx.Deadline(); ok && others {
		// Leave time for another endpoint if this one hangs.
		d = min(d, time.Until(dl)/2)
	}
	if connectLeft >= 0 {
		d = min(d, connectLeft)
	}
	return max(d, minAttempt) + p.Poll
}

// probeTimeout bounds the check of whether an endpoint speaks HTTP at all.
const probeTimeout = time.Second

// refusedFor is how long a call goes on while every endpoint refuses the
// connection and no server has ever answered this Client, when a connect
// timeout is set: a server that is starting opens its port within it, and
// a stopped one never does, so waiting the whole connect timeout only
// hides the cause.
const refusedFor = time.Second

// probe asks ep for GET /readyz over HTTP/1.1 (the API answers it, with
// any status) and reports whether ep surely does not speak HTTP: it closed
// or reset the connection without a byte of HTTP, answered something that
// is not HTTP, or refused the API's TLS protocols (hashicorp/raft's
// transport reads the request as a Raft message and hangs up; with TLS the
// Raft port accepts only its own ALPN protocol). A probe that cannot
// connect, times out, is reset or gets any HTTP answer proves nothing: a
// node over its per-source connection cap resets new connections before
// reading them.
func (c *Caller) probe(ctx context.Context, ep *Node) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL+"/readyz", nil)
	if err != nil {
		return false
	}
	req.Close = true
	resp, err := c.H1.Do(req)
	if err == nil {
		resp.Body.Close()
		return false
	}
	if ctx.Err() != nil || NotSent(err) || IsRefused(err) || errors.Is(err, syscall.ECONNRESET) {
		return false
	}
	return NotHTTP(err)
}

// abandon gives up on ep, which did not answer a keepalive within after:
// its stream fails (pending calls are re-sent elsewhere by their retry
// loops) and its connections close. It is passed over until it answers
// again or SilentFor passes, and a stream to it is reopened only within
// reopenTimeout until it answers.
func (c *Caller) abandon(ep *Node, after time.Duration) {
	c.Eps.Abandoned(ep)
	why := fmt.Errorf("no keepalive answer within %v: node abandoned", after)
	s := ep.Stream.Current()
	if s != nil {
		s.Fail(why)
	}
	n := 0
	if c.Conns != nil {
		n = c.Conns.CloseAddr(DialAddr(ep.URL))
	}
	c.Logger.Warn("endpoint stopped answering; its connections are closed and its calls re-sent elsewhere", "endpoint", ep.URL, "after", after, "connections", n)
}

// heardFrom reports whether anything came from ep since the MonoNow
// reading since. Without the own transports (WithHTTPClient) nothing is
// known, and it reports false: an overdue keepalive then abandons the
// node as before.
func (c *Caller) heardFrom(ep *Node, since int64) bool {
	return c.Conns != nil && c.Conns.HeardSince(DialAddr(ep.URL), since)
}
