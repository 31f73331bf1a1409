package api

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/internal/rpcs"
)

// The session stream over an upgraded HTTP/1.1 connection. A client may
// ask for its stream with an HTTP/1.1 request carrying "Connection:
// Upgrade" and "Upgrade: lockd-stream" (rpcs.StreamUpgrade); the node
// answers 101 Switching Protocols and the connection then carries the
// stream's Connect envelopes both ways, exactly what the body of the
// HTTP/2 stream would carry, with no HTTP/2 framing around them. The
// request goes through every check an HTTP/2 stream's does (Host,
// credentials, limits: the guard's middleware runs before this handler),
// and the stream is served by the same handler. What it saves is net/http's
// HTTP/2 server: its frames, and the hand-offs between its read loop, serve
// loop and handler for every frame (bench/RESULTS.md, "The transport").

// UpgradeStreams serves stream requests that ask for the upgrade on their
// own connection and passes every other request to h.
func UpgradeStreams(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 || !strings.EqualFold(r.Header.Get("Upgrade"), rpcs.StreamUpgrade) || !hasToken(r.Header, "Connection", "upgrade") {
			h.ServeHTTP(w, r)
			return
		}
		ct := r.Header.Get("Content-Type")
		if r.ContentLength != 0 || !strings.HasPrefix(ct, "application/connect+") {
			// The Connect protocol only: gRPC's status travels in HTTP/2
			// trailers, which an upgraded connection has no place for.
			http.Error(w, "an upgrade request has no body and the content type application/connect+proto or +json", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, "upgrade: "+err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		// The server's read and write timeouts are for requests; a stream
		// lasts as long as its client keeps it.
		_ = conn.SetDeadline(time.Time{})
		// The head goes out at once (a client sends its first frame only
		// after it), so it cannot wait for the handler's headers: the
		// answers are never compressed (the client's offer is not passed
		// on), and the content type is the request's.
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + rpcs.StreamUpgrade + "\r\nContent-Type: " + ct + "\r\n\r\n")
		if brw.Flush() != nil {
			return
		}
		in := r.Clone(r.Context()) // the caller found by the guard stays in it
		in.Proto, in.ProtoMajor, in.ProtoMinor = "HTTP/2.0", 2, 0
		for _, k := range []string{"Upgrade", "Connection", "Connect-Accept-Encoding"} {
			in.Header.Del(k)
		}
		in.ContentLength = -1
		in.Body = io.NopCloser(brw.Reader) // holds what came after the request
		uw := &upgradedWriter{conn: conn, w: brw.Writer, header: http.Header{}}
		h.ServeHTTP(uw, in)
		uw.Flush()
	})
}

// hasToken reports whether the comma-separated header key of h holds
// token (case-insensitive).
func hasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// upgradedWriter is the stream handler's http.ResponseWriter on an
// upgraded connection: the body goes to the connection as it is written
// (buffered until a flush); the head was written at the upgrade. A status
// other than 200 (Connect refusing the request itself, before the stream
// has an error frame to send) ends the connection with nothing more
// written: the client sees a stream that broke before its first frame.
type upgradedWriter struct {
	conn   net.Conn
	mu     sync.Mutex // Connect writes from one goroutine; Flush may come from another
	w      *bufio.Writer
	header http.Header
	failed bool
}

// Header implements http.ResponseWriter.
func (u *upgradedWriter) Header() http.Header { return u.header }

// WriteHeader implements http.ResponseWriter.
func (u *upgradedWriter) WriteHeader(code int) {
	if code != http.StatusOK {
		u.mu.Lock()
		u.failed = true
		u.mu.Unlock()
		_ = u.conn.Close()
	}
}

// Write implements http.ResponseWriter.
func (u *upgradedWriter) Write(p []byte) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failed {
		return 0, net.ErrClosed
	}
	return u.w.Write(p)
}

// Flush implements http.Flusher: one write of what is buffered.
func (u *upgradedWriter) Flush() { _ = u.FlushError() }

// FlushError implements the flush of http.ResponseController.
func (u *upgradedWriter) FlushError() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failed {
		return net.ErrClosed
	}
	return u.w.Flush()
}

// SetReadDeadline and SetWriteDeadline implement those of
// http.ResponseController.
func (u *upgradedWriter) SetReadDeadline(t time.Time) error  { return u.conn.SetReadDeadline(t) }
func (u *upgradedWriter) SetWriteDeadline(t time.Time) error { return u.conn.SetWriteDeadline(t) }
