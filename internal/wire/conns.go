package wire

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ConnTracker remembers the client's open connections per dialled address,
// so that abandoning an endpoint can close them (http.Transport closes
// only idle ones), and when a byte last came from each address, so that a
// node that is slow but alive (a keepalive attempt overdue while other
// answers, or HTTP/2 ping replies, still arrive) is not abandoned: only a
// node that sent nothing during the attempt is (Caller.abandon's rule). It
// tracks TCP connections, beneath TLS, so net/http still gets the
// *tls.Conn (tls.go).
type ConnTracker struct {
	mu    sync.Mutex
	conns map[string]map[*trackedConn]struct{}
	heard map[string]*atomic.Int64 // per address: MonoNow of the last byte read
}

func NewConnTracker() *ConnTracker {
	return &ConnTracker{conns: map[string]map[*trackedConn]struct{}{}, heard: map[string]*atomic.Int64{}}
}

// monoEpoch anchors MonoNow.
var monoEpoch = time.Now()

// MonoNow is a monotonic clock reading in nanoseconds (never 0 after
// start: a zero stamp means "nothing heard").
func MonoNow() int64 { return int64(time.Since(monoEpoch)) + 1 }

// trackedConn is a connection the tracker knows until it is closed.
type trackedConn struct {
	net.Conn
	t     *ConnTracker
	addr  string
	heard *atomic.Int64 // shared by the address's connections
	once  sync.Once
}

// Read stamps the address's last-heard time when bytes came: an atomic
// store per read, cheap beside the read itself.
func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.heard.Store(MonoNow())
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

type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// wrap returns dial recording every connection it opens.
func (t *ConnTracker) wrap(dial DialFunc) DialFunc {
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
func (t *ConnTracker) Track(tr *http.Transport) {
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	tr.DialContext = t.wrap(dial)
}

// heardSince reports whether a byte came from addr at or after the
// MonoNow reading since.
func (t *ConnTracker) HeardSince(addr string, since int64) bool {
	t.mu.Lock()
	h := t.heard[addr]
	t.mu.Unlock()
	return h != nil && h.Load() >= since
}

// closeAddr closes every tracked connection to addr and returns how many.
func (t *ConnTracker) CloseAddr(addr string) int {
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

// DialAddr is the host:port the transport dials for an endpoint URL.
func DialAddr(u string) string {
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

// ConnLost reports whether err is an HTTP/2 connection that its pings
// found dead (the bundled http2's errClientConnLost, not exported, and
// net/http offers no sentinel for it, so the message is matched;
// TestConnLostMatchesPingTimeout pins it): a frozen node, not a server
// that answered without a stream.
func ConnLost(err error) bool {
	return err != nil && strings.Contains(err.Error(), "http2: client connection lost")
}
