package wire_test

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/api"
	"github.com/lockd-dev/lockd/internal/wire"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// echoStream answers each frame with its call id and reports its end.
type echoStream struct {
	lockdv1connect.UnimplementedSessionServiceHandler
	ended chan struct{}
}

func (e echoStream) Stream(_ context.Context, st *connect.BidiStream[lockdv1.StreamRequest, lockdv1.StreamResponse]) error {
	defer close(e.ended)
	for {
		req, err := st.Receive()
		if err != nil {
			return nil
		}
		if err := st.Send(&lockdv1.StreamResponse{CallId: req.GetCallId()}); err != nil {
			return err
		}
	}
}

// countingTransport counts the requests it carries.
type countingTransport struct {
	http.RoundTripper
	n atomic.Int32
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.RoundTripper.RoundTrip(r)
}

// serveEcho serves the echo stream on 127.0.0.1 over HTTP/1.1 and h2c,
// with the node's upgrade handler in front when upgrade is set.
func serveEcho(t *testing.T, upgrade bool) (url string, ended chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ended = make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle(lockdv1connect.NewSessionServiceHandler(echoStream{ended: ended}))
	var h http.Handler = mux
	if upgrade {
		h = api.UpgradeStreams(mux, new(api.Upgrades))
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), ended
}

// The stream goes on an upgraded connection when the server upgrades, and
// over HTTP/2 when it does not (an older server); either way its frames
// are answered and the client's end of the stream ends the server's.
func TestUpgradeOrHTTP2(t *testing.T) {
	for _, upgrade := range []bool{true, false} {
		name := map[bool]string{true: "upgrading server", false: "older server"}[upgrade]
		t.Run(name, func(t *testing.T) {
			url, ended := serveEcho(t, upgrade)
			h2, h1 := wire.NewTransports()
			c1 := &countingTransport{RoundTripper: h1}
			c2 := &countingTransport{RoundTripper: h2}
			defer h1.CloseIdleConnections()
			defer h2.CloseIdleConnections()
			cl := lockdv1connect.NewSessionServiceClient(
				wire.UpgradeHTTPClient(&http.Client{Transport: c1}, wire.StreamHTTPClient(&http.Client{Transport: c2})), url)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			st := cl.Stream(ctx)
			for id := uint64(1); id <= 3; id++ {
				if err := st.Send(&lockdv1.StreamRequest{CallId: id}); err != nil {
					t.Fatal(err)
				}
				r, err := st.Receive()
				if err != nil {
					t.Fatal(err)
				}
				if r.GetCallId() != id {
					t.Fatalf("answer to call %d, want %d", r.GetCallId(), id)
				}
			}
			want := map[bool][2]int32{true: {1, 0}, false: {1, 1}}[upgrade]
			if got := [2]int32{c1.n.Load(), c2.n.Load()}; got != want {
				t.Errorf("requests over HTTP/1.1 and HTTP/2: %v, want %v", got, want)
			}
			_ = st.CloseRequest()
			cancel()
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("the server's stream did not end with the client's")
			}
		})
	}
}
