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

// abandon gives up on ep, which did not answer a keepalive within after:
// its stream fails (pending calls are re-sent elsewhere by their retry
// loops) and its connections close. It is passed over until it answers
// again or wire.SilentFor passes, and a stream to it is reopened only within
// reopenTimeout until it answers.
func (c *Client) abandon(ep *wire.Node, after time.Duration) {
	c.eps.Abandoned(ep)
	why := fmt.Errorf("no keepalive answer within %v: node abandoned", after)
	s := ep.Stream.Current()
	if s != nil {
		s.Fail(why)
	}
	n := 0
	if c.conns != nil {
		n = c.conns.CloseAddr(wire.DialAddr(ep.URL))
	}
	c.logger.Warn("endpoint stopped answering; its connections are closed and its calls re-sent elsewhere", "endpoint", ep.URL, "after", after, "connections", n)
}

// heardFrom reports whether anything came from ep since the wire.MonoNow
// reading since. Without the own transports (WithHTTPClient) nothing is
// known, and it reports false: an overdue keepalive then abandons the
// node as before.
func (c *Client) heardFrom(ep *wire.Node, since int64) bool {
	return c.conns != nil && c.conns.HeardSince(wire.DialAddr(ep.URL), since)
}
