package wire

import (
	"context"
	"errors"
	"net/http"
	"time"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"connectrpc.com/connect"
)

// NewTransports returns the client's own transports: h2c (and HTTP/2 over
// TLS) for the stream and for unary calls to endpoints whose stream is
// open, so one connection carries everything, and HTTP/1.1 for the others.
func NewTransports() (h2, h1 *http.Transport) {
	h1 = http.DefaultTransport.(*http.Transport).Clone()
	// Each queued Lock holds a connection for its long poll.
	h1.MaxIdleConnsPerHost = 256
	// HTTP/1.1 even over TLS (no h2 by ALPN): the session stream's
	// upgrade (upgrade.go) needs it, and HTTP/2 is h2's.
	h1.Protocols = new(http.Protocols)
	h1.Protocols.SetHTTP1(true)
	h2 = http.DefaultTransport.(*http.Transport).Clone()
	h2.Protocols = new(http.Protocols)
	h2.Protocols.SetHTTP2(true)
	h2.Protocols.SetUnencryptedHTTP2(true)
	// Pings find a dead connection (a frozen or unplugged node) once
	// nothing has come from it for PingAfter, so its calls (a closing
	// session's Close, a Release: no keepalive of theirs goes there to
	// notice, see Caller.abandon) fail over instead of waiting for their
	// timeouts.
	h2.HTTP2 = &http.HTTP2Config{SendPingTimeout: PingAfter, PingTimeout: PingTimeout}
	return h2, h1
}

// CtxError is err (which wraps ctx.Err()) as a unary call whose ctx ended
// would report it: DeadlineExceeded or Canceled.
func CtxError(ctx context.Context, err error) error {
	code := connect.CodeCanceled
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		code = connect.CodeDeadlineExceeded
	}
	return connect.NewError(code, err)
}

// FromStreamError rebuilds the *connect.Error a unary call would have
// returned.
func FromStreamError(e *lockdv1.StreamError) error {
	ce := connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage()))
	if e.GetDetail() != nil {
		if d, err := connect.NewErrorDetail(e.GetDetail()); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// PingAfter and PingTimeout: an HTTP/2 connection silent for PingAfter
// is pinged, and closed (its calls re-sent with their seq) when the ping
// is not answered within PingTimeout. A live node answers a ping from its
// connection's read loop, without waiting for Raft, in microseconds; a
// second leaves room for a loaded machine's scheduling.
const (
	PingAfter   = time.Second
	PingTimeout = time.Second
)
