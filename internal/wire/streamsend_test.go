package wire

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// stallingSessions is a session service that reads no frame until
// release is closed, then answers each frame it reads, recording it. A
// lockd node reads on while its pools have room; a peer that stops
// reading (flow control holds the client's sender) is a fault a real node
// does not produce on demand, hence this stand-in.
type stallingSessions struct {
	lockdv1connect.UnimplementedSessionServiceHandler
	release chan struct{}
	mu      sync.Mutex
	got     map[uint64]*lockdv1.StreamRequest
}

func (h *stallingSessions) Stream(ctx context.Context, st *connect.BidiStream[lockdv1.StreamRequest, lockdv1.StreamResponse]) error {
	if err := st.Send(&lockdv1.StreamResponse{ClusterId: "c"}); err != nil {
		return err
	}
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil
	}
	for {
		r, err := st.Receive()
		if err != nil {
			return nil
		}
		h.mu.Lock()
		h.got[r.GetCallId()] = r
		h.mu.Unlock()
		resp := &lockdv1.StreamResponse{CallId: r.GetCallId(), Body: &lockdv1.StreamResponse_Release{Release: &lockdv1.ReleaseResponse{}}}
		if r.GetAcquire() != nil {
			resp.Body = &lockdv1.StreamResponse_Acquire{Acquire: &lockdv1.AcquireResponse{}}
		}
		if err := st.Send(resp); err != nil {
			return nil
		}
	}
}

// readSignal closes started once the transport has read some of the
// stream's request body (the first call is being sent).
type readSignal struct {
	io.ReadCloser
	n       int
	once    sync.Once
	started chan struct{}
}

func (r *readSignal) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if r.n += n; r.n >= 64<<10 {
		r.once.Do(func() { close(r.started) })
	}
	return n, err
}

// TestReturnedCallsRequestIsNotReadAfter: a call that returns before its
// request left (its ctx ended while another call's request held the
// sender) must leave its request alone: the caller owns its message again
// (Client.Service callers reuse theirs), so the request must not be
// marshalled later with what the caller has since written into it.
func TestReturnedCallsRequestIsNotReadAfter(t *testing.T) {
	h := &stallingSessions{release: make(chan struct{}), got: map[uint64]*lockdv1.StreamRequest{}}
	mux := http.NewServeMux()
	mux.Handle(lockdv1connect.NewSessionServiceHandler(h))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
	}()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	started := make(chan struct{})
	hc := doFunc(func(r *http.Request) (*http.Response, error) {
		r.Body = &readSignal{ReadCloser: r.Body, started: started}
		return (&http.Client{Transport: tr}).Do(r)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	st := lockdv1connect.NewSessionServiceClient(StreamHTTPClient(hc), srv.URL).Stream(sctx)
	if err := st.Send(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); err != nil {
		t.Fatal(err)
	}
	s := NewStream(srv.URL, &StreamSlot{}, st, scancel)
	go s.read()
	defer s.Close(errors.New("test over"))

	// A request larger than the peer's flow-control windows holds the
	// sender until the peer reads.
	bigDone := make(chan error, 1)
	go func() {
		_, err := s.Call(ctx, &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{Name: "big", Value: make([]byte, 4<<20)}}})
		bigDone <- err
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the first request was never read")
	}
	// A call whose ctx has ended returns at once; then its caller reuses
	// its message.
	msg := &lockdv1.ReleaseRequest{Name: "mine", Seq: 1}
	gone, stop := context.WithCancel(ctx)
	stop()
	if _, err := s.Call(gone, &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Release{Release: msg}}); err == nil {
		t.Fatal("a call whose ctx ended was answered")
	}
	msg.Name = "written after the call returned"

	close(h.release)
	released = true
	if err := <-bigDone; err != nil {
		t.Fatalf("big acquire: %v", err)
	}
	// A later call's answer: everything queued before it has been read.
	if _, err := s.Call(ctx, &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Release{Release: &lockdv1.ReleaseRequest{Name: "last", Seq: 2}}}); err != nil {
		t.Fatalf("last call: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.got[2]; r != nil && r.GetRelease().GetName() != "mine" {
		t.Errorf("the returned call's request reached the server as %q: read after the call returned", r.GetRelease().GetName())
	}
}
