package api

import (
	"bufio"
	"context"
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
// request goes through every check an HTTP/2 stream's does: the Host
// check before the upgrade (the guard's middleware runs before this
// handler), credentials and limits after it, by the same stream handler. What it saves is net/http's
// HTTP/2 server: its frames, and the hand-offs between its read loop, serve
// loop and handler for every frame (bench/RESULTS.md, "The transport").

// HeartbeatEvery is how long a stream on an upgraded connection may write
// nothing before it sends an empty frame (call_id 0, no body); checked
// every half interval, so its client hears from a live node at least
// every 1.5 s, well within its silence limit (internal/wire:
// SilenceLimit, 3 s).
const HeartbeatEvery = time.Second

// upgradeWriteTimeout bounds one flush of an upgraded stream's answers:
// a client that reads nothing for that long loses its stream (HTTP/2 had
// its flow-control window and the server's Close to cut it).
const upgradeWriteTimeout = 10 * time.Second

// Upgrades tracks the connections being served upgraded, which http.Server
// stops tracking once they are hijacked, so that the node's Close can wait
// for them. The zero value is ready.
type Upgrades struct {
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// begin registers c; false once Close began (the upgrade is refused).
func (u *Upgrades) begin(c net.Conn) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return false
	}
	if u.conns == nil {
		u.conns = map[net.Conn]struct{}{}
	}
	u.conns[c] = struct{}{}
	u.wg.Add(1)
	return true
}

func (u *Upgrades) end(c net.Conn) {
	u.mu.Lock()
	delete(u.conns, c)
	u.mu.Unlock()
	u.wg.Done()
}

// Close refuses further upgrades and waits for the streams being served
// to end (they end when the node stops, see Stream) until ctx ends; then
// it closes their connections and waits for their handlers to return.
func (u *Upgrades) Close(ctx context.Context) {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	ended := make(chan struct{})
	go func() {
		u.wg.Wait()
		close(ended)
	}()
	select {
	case <-ended:
		return
	case <-ctx.Done():
	}
	u.mu.Lock()
	for c := range u.conns {
		_ = c.Close()
	}
	u.mu.Unlock()
	<-ended
}

// upgradedKey marks, in a stream's request context, a stream served on
// an upgraded connection (Stream sends it heartbeats).
type upgradedKey struct{}

// isUpgraded reports whether the stream of ctx is on an upgraded
// connection.
func isUpgraded(ctx context.Context) bool { return ctx.Value(upgradedKey{}) != nil }

// UpgradeStreams serves stream requests that ask for the upgrade on their
// own connection, tracked by t, and passes every other request to h.
func UpgradeStreams(h http.Handler, t *Upgrades) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 || !strings.EqualFold(r.Header.Get("Upgrade"), rpcs.StreamUpgrade) || !hasToken(r.Header, "Connection", "upgrade") {
			h.ServeHTTP(w, r)
			return
		}
		// What Connect would refuse with an HTTP status is refused here,
		// before the upgrade, where a status can still be sent. The
		// Connect protocol only: gRPC's status travels in HTTP/2
		// trailers, which an upgraded connection has no place for.
		ct := r.Header.Get("Content-Type")
		if r.Method != http.MethodPost || r.ContentLength != 0 || (ct != "application/connect+proto" && ct != "application/connect+json") {
			http.Error(w, "a stream upgrade is a POST with no body and the content type application/connect+proto or application/connect+json", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, "upgrade: "+err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		if !t.begin(conn) {
			_, _ = brw.WriteString("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			_ = brw.Flush()
			return
		}
		defer t.end(conn)
		// The server's read and write timeouts are for requests; a stream
		// lasts as long as its client keeps it.
		_ = conn.SetDeadline(time.Time{})
		// The head goes out at once (a client sends its first frame only
		// after it), so it cannot wait for the handler's headers: the
		// answers are never compressed (the client's offer is not passed
		// on), and the content type is the request's. Credentials are
		// judged after it, by the stream's handler, as over HTTP/2: a
		// refused caller gets the stream's end with the error.
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + rpcs.StreamUpgrade + "\r\nContent-Type: " + ct + "\r\n\r\n")
		if brw.Flush() != nil {
			return
		}
		in := r.Clone(context.WithValue(r.Context(), upgradedKey{}, true)) // the caller found by the guard stays in it
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
	if u.w.Buffered() == 0 {
		return nil
	}
	_ = u.conn.SetWriteDeadline(time.Now().Add(upgradeWriteTimeout))
	return u.w.Flush()
}

// SetReadDeadline and SetWriteDeadline implement those of
// http.ResponseController.
func (u *upgradedWriter) SetReadDeadline(t time.Time) error  { return u.conn.SetReadDeadline(t) }
func (u *upgradedWriter) SetWriteDeadline(t time.Time) error { return u.conn.SetWriteDeadline(t) }
