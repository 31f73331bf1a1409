package lockd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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

// connTracker remembers the client's open connections per dialled address,
// so that abandoning an endpoint can close them (http.Transport closes
// only idle ones), and when a byte last came from each address, so that a
// node that is slow but alive (a keepalive attempt overdue while other
// answers, or HTTP/2 ping replies, still arrive) is not abandoned: only a
// node that sent nothing during the attempt is (abandon.go's rule). It
// tracks TCP connections, beneath TLS, so net/http still gets the
// *tls.Conn (tls.go).
type connTracker struct {
	mu    sync.Mutex
	conns map[string]map[*trackedConn]struct{}
	heard map[string]*atomic.Int64 // per address: monoNow of the last byte read
}

func newConnTracker() *connTracker {
	return &connTracker{conns: map[string]map[*trackedConn]struct{}{}, heard: map[string]*atomic.Int64{}}
}

// monoEpoch anchors monoNow.
var monoEpoch = time.Now()

// monoNow is a monotonic clock reading in nanoseconds (never 0 after
// start: a zero stamp means "nothing heard").
func monoNow() int64 { return int64(time.Since(monoEpoch)) + 1 }

// trackedConn is a connection the tracker knows until it is closed.
type trackedConn struct {
	net.Conn
	t     *connTracker
	addr  string
	heard *atomic.Int64 // shared by the address's connections
	once  sync.Once
}

// Read stamps the address's last-heard time when bytes came: an atomic
// store per read, cheap beside the read itself.
func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.heard.Store(monoNow())
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns[c.addr], c)
		if len(c.t.conns[c.addr]) == 0 {
			delete(c.t.conns, c.addr)
		}
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// wrap returns dial recording every connection it opens.
func (t *connTracker) wrap(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		t.mu.Lock()
		h := t.heard[addr]
		if h == nil {
			// One stamp per address, kept after its connections close
			// (the client dials a bounded set of endpoints).
			h = new(atomic.Int64)
			t.heard[addr] = h
		}
		tc := &trackedConn{Conn: conn, t: t, addr: addr, heard: h}
		if t.conns[addr] == nil {
			t.conns[addr] = map[*trackedConn]struct{}{}
		}
		t.conns[addr][tc] = struct{}{}
		t.mu.Unlock()
		return tc, nil
	}
}

// track makes tr's connections tracked at the TCP level: its
// DialContext, which the TLS dial of WithTLSFiles (tls.go) and net/http's
// own TLS (WithTLSConfig) run beneath the handshake. DialTLSContext is
// not wrapped: a wrapper would hide the *tls.Conn from net/http (no
// resp.TLS, no HTTP/2 by ALPN).
func (t *connTracker) track(tr *http.Transport) {
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	tr.DialContext = t.wrap(dial)
}

// heardSince reports whether a byte came from addr at or after the
// monoNow reading since.
func (t *connTracker) heardSince(addr string, since int64) bool {
	t.mu.Lock()
	h := t.heard[addr]
	t.mu.Unlock()
	return h != nil && h.Load() >= since
}

// closeAddr closes every tracked connection to addr and returns how many.
func (t *connTracker) closeAddr(addr string) int {
	t.mu.Lock()
	var cs []*trackedConn
	for c := range t.conns[addr] {
		cs = append(cs, c)
	}
	t.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	return len(cs)
}

// dialAddr is the host:port the transport dials for an endpoint URL.
func dialAddr(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	port := p.Port()
	if port == "" {
		port = "80"
		if p.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(p.Hostname(), port)
}

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
	ep.stream.mu.Lock()
	s := ep.stream.cur
	ep.stream.mu.Unlock()
	if s != nil {
		s.fail(why)
	}
	n := 0
	if c.conns != nil {
		n = c.conns.closeAddr(dialAddr(ep.url))
	}
	c.logger.Warn("endpoint stopped answering; its connections are closed and its calls re-sent elsewhere", "endpoint", ep.url, "after", after, "connections", n)
}

// heardFrom reports whether anything came from ep since the monoNow
// reading since. Without the own transports (WithHTTPClient) nothing is
// known, and it reports false: an overdue keepalive then abandons the
// node as before.
func (c *Client) heardFrom(ep *node, since int64) bool {
	return c.conns != nil && c.conns.heardSince(dialAddr(ep.url), since)
}

// connLost reports whether err is an HTTP/2 connection that its pings
// found dead (the bundled http2's errClientConnLost, not exported, and
// net/http offers no sentinel for it, so the message is matched;
// TestConnLostMatchesPingTimeout pins it): a frozen node, not a server
// that answered without a stream.
func connLost(err error) bool {
	return err != nil && strings.Contains(err.Error(), "http2: client connection lost")
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
