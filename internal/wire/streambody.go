package wire

import (
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Connect writes each message of a stream into the request body as two
// writes, its 5-byte envelope prefix and then its bytes, and Go's HTTP/2
// transport sends every read of the body as its own DATA frame with its
// own flush: two frames and two write syscalls per message, and on the
// server two frame headers and two payloads to read. Reading the body a
// whole envelope at a time makes each message one frame and one write.

// StreamHTTPClient wraps the HTTP client of the session service so that
// the session stream's request body is read whole envelopes at a time.
// Other requests pass through unchanged.
func StreamHTTPClient(c connect.HTTPClient) connect.HTTPClient { return envelopeClient{c} }

// envelopeClient is StreamHTTPClient's client.
type envelopeClient struct{ next connect.HTTPClient }

// Do implements connect.HTTPClient.
func (c envelopeClient) Do(req *http.Request) (*http.Response, error) {
	// Only the stream's body: a pipe (no GetBody, no length) of Connect
	// or gRPC envelopes, written one message at a time.
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil &&
		strings.HasSuffix(req.URL.Path, lockdv1connect.SessionServiceStreamProcedure) {
		req.Body = &envelopeBody{r: req.Body, more: moreHintOf(req.Context())}
	}
	return c.next.Do(req)
}

// envelopeBody reads a body of envelopes so that a read that has started
// an envelope returns only once the envelope is whole (or p is full, or
// the body ends): the envelope's writer writes its rest at once, so the
// wait is a hand-off, never a wait for the next message. A read stops at
// the end of an envelope, unless the stream's sender says more envelopes
// of its batch follow (streamsend.go), which it writes at once.
type envelopeBody struct {
	r      io.ReadCloser
	more   *atomic.Int32 // while not zero, more envelopes are being written: read on (nil: never)
	prefix [5]byte
	got    int // bytes of the current envelope's prefix read
	left   int // bytes of the current envelope's message still to read
}

// Read implements io.Reader.
func (b *envelopeBody) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		var want int
		if b.got < len(b.prefix) {
			want = len(b.prefix) - b.got
		} else {
			want = b.left
		}
		want = min(want, len(p)-n)
		m, err := b.r.Read(p[n : n+want])
		if b.got < len(b.prefix) {
			copy(b.prefix[b.got:], p[n:n+m])
			b.got += m
			if b.got == len(b.prefix) {
				b.left = int(binary.BigEndian.Uint32(b.prefix[1:]))
			}
		} else {
			b.left -= m
		}
		n += m
		if b.got == len(b.prefix) && b.left == 0 {
			b.got = 0 // the envelope is whole
			if n > 0 && (err != nil || b.more == nil || b.more.Load() == 0) {
				return n, err
			}
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Close implements io.Closer.
func (b *envelopeBody) Close() error { return b.r.Close() }
