package lockd

import (
	"context"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"

	"github.com/lockd-dev/lockd/internal/api"
	"github.com/lockd-dev/lockd/internal/wire"
)

// A stream being opened to a node that accepts connections and never
// answers (a fake of a frozen node: a real one cannot be frozen at this
// exact point on demand) must not hold up the endpoint's other calls past
// their own deadlines: a keepalive waits at most its ctx, not the opener's
// long-poll budget.
func TestStreamOpenDoesNotHoldEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dialed := make(chan struct{}, 16)
	var conns sync.WaitGroup
	done := make(chan struct{})
	defer func() { close(done); ln.Close(); conns.Wait() }()
	conns.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			dialed <- struct{}{}
			conns.Go(func() { <-done; conn.Close() })
		}
	})
	c, err := New(WithEndpoints("http://"+ln.Addr().String()), WithStream(true))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ep := c.eps.All()[0]

	long, cancelLong := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancelLong()
	var opener sync.WaitGroup
	defer opener.Wait()
	defer cancelLong()
	opener.Go(func() { _, _ = c.call.OpenStream(long, ep) })
	select {
	case <-dialed: // the open is under way, waiting for an answer
	case <-time.After(10 * time.Second):
		t.Fatal("the opener never reached the node")
	}

	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.call.OpenStream(short, ep); err == nil {
		t.Fatal("opened a stream to a node that never answers")
	}
	if waited := time.Since(start); waited > 3*time.Second {
		t.Fatalf("a call with a 200ms deadline waited %v behind another call's open", waited)
	}
}

// Every keepalive frame fits the server's 64 KiB read limit (a frame over
// it breaks the whole stream, and every session of the client is lost):
// 1000 sessions with the client's own secrets (64 characters) used to make
// one frame of about 100 KiB.
func TestKeepAliveFramesFitServerLimit(t *testing.T) {
	const serverLimit = 64 << 10 // internal/server maxRequestBytes
	for _, secretLen := range []int{64, 256} {
		var batch []*Session
		for range 2500 {
			batch = append(batch, &Session{id: randomID(), secret: strings.Repeat("s", secretLen)})
		}
		seen := 0
		for _, f := range wire.SplitBatch(batch, sessionEntry) {
			frame := &lockdv1.KeepAliveBatch{}
			for _, s := range f {
				if s != batch[seen] {
					t.Fatalf("secret %d: frames do not cover the batch in order", secretLen)
				}
				seen++
				frame.Sessions = append(frame.Sessions, &lockdv1.KeepAliveRequest{SessionId: s.id, Secret: s.secret})
			}
			req := &lockdv1.StreamRequest{CallId: math.MaxUint64, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: frame}}
			if n := proto.Size(req); n > serverLimit || len(f) > wire.MaxBatch || len(f) == 0 {
				t.Fatalf("secret %d: frame of %d sessions is %d bytes (limit %d)", secretLen, len(f), n, serverLimit)
			}
		}
		if seen != len(batch) {
			t.Fatalf("secret %d: frames name %d of %d sessions", secretLen, seen, len(batch))
		}
	}
}

// sessionEntry is what a session puts in a KeepAliveBatch frame.
func sessionEntry(s *Session) (id, secret string) { return s.id, s.secret }

// frozenAfterOpen serves the session stream upgraded, answers its opening
// frame, then writes nothing more (no heartbeat): a fake of a node frozen
// right after the stream opened (a real one cannot be frozen at this exact
// point on demand).
type frozenAfterOpen struct {
	lockdv1connect.UnimplementedSessionServiceHandler
	release chan struct{}
}

func (f frozenAfterOpen) Stream(ctx context.Context, st *connect.BidiStream[lockdv1.StreamRequest, lockdv1.StreamResponse]) error {
	if err := st.Send(&lockdv1.StreamResponse{ClusterId: "frozen"}); err != nil {
		return err
	}
	select {
	case <-f.release:
	case <-ctx.Done():
	}
	return nil
}

// A stream on an upgraded connection has no HTTP/2 pings: a node that
// falls silent fails it after wire.SilenceLimit, so its calls are re-sent
// instead of waiting out their timeouts.
func TestUpgradedStreamFailsWhenNodeFallsSilent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := frozenAfterOpen{release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle(lockdv1connect.NewSessionServiceHandler(f))
	srv := &http.Server{Handler: api.UpgradeStreams(mux, new(api.Upgrades)), Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	go srv.Serve(ln)
	defer srv.Close()
	defer close(f.release)
	c, err := New(WithEndpoints("http://"+ln.Addr().String()), WithStream(true))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ep := c.eps.All()[0]
	start := time.Now()
	st, err := c.call.OpenStream(t.Context(), ep)
	if err != nil {
		t.Fatal(err)
	}
	// A call the frozen node never answers.
	ctx, cancel := context.WithTimeout(t.Context(), wire.SilenceLimit+10*time.Second)
	defer cancel()
	_, err = st.Call(ctx, &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Release{Release: &lockdv1.ReleaseRequest{SessionId: "s", Seq: 1, Name: "a"}}})
	if err == nil || !strings.Contains(err.Error(), "taken for frozen") {
		t.Fatalf("call on a silent node's stream: %v, want the stream failed as frozen", err)
	}
	if took := time.Since(start); took < wire.SilenceLimit {
		t.Fatalf("the stream failed after %v, before the silence limit %v", took, wire.SilenceLimit)
	}
	// Fail lets the endpoint's slot go just after the calls fail.
	for deadline := time.Now().Add(5 * time.Second); ep.Stream.IsOpen(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the failed stream is still the endpoint's")
		}
	}
}
