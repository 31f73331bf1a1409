package lockd

import (
	"fmt"
	"time"

	"github.com/lockd-dev/lockd/internal/wire"
)

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

// reopenTimeout bounds opening a stream to an endpoint abandoned since it
// last answered: a live node opens one in milliseconds, and a call (an
// Acquire) sent there after a stale leader hint must not wait a whole
// request timeout on a node that is still frozen.
const reopenTimeout = time.Second

// staleHintFor is how long after abandoning a node the client does not
// let a leader hint naming it bring it back: a follower names a frozen
// leader until its own heartbeat timeout passes (400–800 ms at the
// servers' defaults) and an election starts, so such a hint is stale, and
// following it would send the calls straight back to the frozen node.
// Later hints are followed: a leader that was only slow to answer is
// found again in time for the sessions' leases.
const staleHintFor = time.Second

// abandon gives up on ep, which did not answer a keepalive within after:
// its stream fails (pending calls are re-sent elsewhere by their retry
// loops) and its connections close. It is passed over until it answers
// again or silentFor passes, and a stream to it is reopened only within
// reopenTimeout until it answers.
func (c *Client) abandon(ep *node, after time.Duration) {
	c.mu.Lock()
	ep.silent = time.Now().Add(silentFor)
	ep.abandon = true
	ep.leftAt = time.Now()
	c.mu.Unlock()
	why := fmt.Errorf("no keepalive answer within %v: node abandoned", after)
	s := ep.stream.Current()
	if s != nil {
		s.Fail(why)
	}
	n := 0
	if c.conns != nil {
		n = c.conns.CloseAddr(wire.DialAddr(ep.url))
	}
	c.logger.Warn("endpoint stopped answering; its connections are closed and its calls re-sent elsewhere", "endpoint", ep.url, "after", after, "connections", n)
}

// heardFrom reports whether anything came from ep since the wire.MonoNow
// reading since. Without the own transports (WithHTTPClient) nothing is
// known, and it reports false: an overdue keepalive then abandons the
// node as before.
func (c *Client) heardFrom(ep *node, since int64) bool {
	return c.conns != nil && c.conns.HeardSince(wire.DialAddr(ep.url), since)
}

// openTimeout is how long opening a stream to ep may take: reopenTimeout
// for a node abandoned since it last answered, and for a node this client
// never heard from while another one answers it (a call moved there after
// a failure elsewhere, with no hint: that node may be the frozen leader
// the failure came from, and its hello, which a live node sends without
// Raft, would never come); the request timeout otherwise (a cold start on
// a busy machine).
func (c *Client) openTimeout(ep *node) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ep.abandon || (c.spoke && !ep.spoke) {
		return min(c.cfg.requestTimeout, reopenTimeout)
	}
	return c.cfg.requestTimeout
}

// abandonedLately reports whether ep was abandoned and has not answered
// since.
func (c *Client) abandonedLately(ep *node) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ep.abandon
}
