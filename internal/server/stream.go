package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// The session stream (SessionService.Stream): a client's session-scoped
// calls as frames on one HTTP/2 stream. Each call runs through the same
// handler as its unary RPC (leader or forward, validation, proposal,
// blocking wait); only KeepAlive has its own batched form. A stream is
// transport: its end ends no session and releases nothing.

// streamInFlight bounds the calls of one stream being served at once, in
// each of two pools: Acquires (which may park for a long poll) and every
// other call (short: one proposal or one leadership check). The reader
// stops reading frames while the pool of the next frame is full, so a
// client cannot make the server hold unbounded memory (HTTP/2 flow control
// then holds the client back); and parked Acquires never hold up a
// KeepAlive, Release or Cancel, as long as the client keeps fewer Acquires
// in flight than this (the Go client keeps at most half).
const streamInFlight = 256

// answer is a call's answer and the pool slot it frees once written.
type answer struct {
	resp  *lockdv1.StreamResponse
	slots chan struct{}
}

// maxKeepAliveBatch bounds the sessions of one KeepAliveBatch (the client
// splits larger rounds; a frame stays under maxRequestBytes).
const maxKeepAliveBatch = 1000

// sessionAPI implements lockdv1connect.SessionServiceHandler.
type sessionAPI struct{ a *api }

var _ lockdv1connect.SessionServiceHandler = (*sessionAPI)(nil)

// streamKinds are the values of the kind label of
// lockd_api_stream_frames_total.
var streamKinds = []string{"create_session", "keep_alive", "acquire", "release", "cancel", "complete", "close_session", "invalid"}

// Stream serves one session stream: one reader (this goroutine), a
// goroutine per call in flight (at most streamInFlight) and one writer.
func (h *sessionAPI) Stream(ctx context.Context, st *connect.BidiStream[lockdv1.StreamRequest, lockdv1.StreamResponse]) error {
	s := h.a.s
	s.metrics.streamsOpen.Inc()
	defer s.metrics.streamsOpen.Dec()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The first frame tells the client the stream is open (HTTP/2 passed
	// end to end); without it a client could not tell a stream a proxy
	// swallowed from one with no answers yet.
	if err := st.Send(&lockdv1.StreamResponse{ClusterId: h.a.clusterID()}); err != nil {
		return err
	}
	out := make(chan answer, 2*streamInFlight)
	waitSlots := make(chan struct{}, streamInFlight)
	shortSlots := make(chan struct{}, streamInFlight)
	writerDone := make(chan error, 1)
	go func() {
		// The single writer. A slot is freed only once its answer is
		// written, so answers waiting for a slow reader count too.
		var err error
		for r := range out {
			if err == nil {
				if err = st.Send(r.resp); err != nil {
					cancel() // the client is gone: stop the calls in flight
				}
			}
			<-r.slots
		}
		writerDone <- err
	}()
	// Frames are read in their own goroutine, so that a shutdown of this
	// node ends the stream at once (the client goes elsewhere) instead of
	// keeping it served until the HTTP server's shutdown times out.
	frames := make(chan *lockdv1.StreamRequest)
	readErr := make(chan error, 1)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for {
			req, err := st.Receive()
			if err != nil {
				readErr <- err
				return
			}
			select {
			case frames <- req:
			case <-quit:
				return
			}
		}
	}()
	var calls sync.WaitGroup
	var rerr error
loop:
	for {
		var req *lockdv1.StreamRequest
		select {
		case req = <-frames:
		case err := <-readErr:
			if !errors.Is(err, io.EOF) {
				rerr = err
			}
			break loop
		case <-ctx.Done():
			break loop
		case <-s.done:
			rerr = s.raftError(raft.ErrRaftShutdown)
			break loop
		}
		slots := shortSlots
		if _, ok := req.GetBody().(*lockdv1.StreamRequest_Acquire); ok {
			slots = waitSlots
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break loop
		case <-s.done:
			rerr = s.raftError(raft.ErrRaftShutdown)
			break loop
		}
		received := time.Now()
		calls.Go(func() { out <- answer{h.serve(ctx, req, received), slots} })
	}
	calls.Wait()
	close(out)
	werr := <-writerDone
	if rerr != nil {
		return rerr
	}
	return werr
}

// serve answers one frame; it never fails, an error is an answer too.
func (h *sessionAPI) serve(ctx context.Context, req *lockdv1.StreamRequest, received time.Time) *lockdv1.StreamResponse {
	s, a := h.a.s, h.a
	resp := &lockdv1.StreamResponse{CallId: req.GetCallId()}
	var err error
	if req.GetCallId() == 0 {
		kind := "invalid"
		// Not served: its answer could not be told from the open frame.
		s.metrics.streamFrames.WithLabelValues(kind).Inc()
		resp.Body = &lockdv1.StreamResponse_Error{Error: streamError(s.invalid("call_id 0 is reserved"))}
		resp.ClusterId = a.clusterID()
		return resp
	}
	kind, msg := frameKind(req)
	err = s.guard(ctx, msg, kind, func(ctx context.Context) error {
		var err error
		switch b := req.GetBody().(type) {
		case nil:
			err = s.invalid("stream request without a body")
		case *lockdv1.StreamRequest_CreateSession:
			var r *lockdv1.CreateSessionResponse
			if r, err = unaryCall(ctx, a, b.CreateSession, a.CreateSession); err == nil {
				resp.Body = &lockdv1.StreamResponse_CreateSession{CreateSession: r}
			}
		case *lockdv1.StreamRequest_KeepAlive:
			var r *lockdv1.KeepAliveBatchResponse
			if r, err = h.keepAliveBatch(ctx, b.KeepAlive, received); err == nil {
				resp.Body = &lockdv1.StreamResponse_KeepAlive{KeepAlive: r}
			}
		case *lockdv1.StreamRequest_Acquire:
			var r *lockdv1.AcquireResponse
			if r, err = unaryCall(ctx, a, b.Acquire, a.Acquire); err == nil {
				resp.Body = &lockdv1.StreamResponse_Acquire{Acquire: r}
			}
		case *lockdv1.StreamRequest_Release:
			var r *lockdv1.ReleaseResponse
			if r, err = unaryCall(ctx, a, b.Release, a.Release); err == nil {
				resp.Body = &lockdv1.StreamResponse_Release{Release: r}
			}
		case *lockdv1.StreamRequest_Cancel:
			var r *lockdv1.CancelResponse
			if r, err = unaryCall(ctx, a, b.Cancel, a.Cancel); err == nil {
				resp.Body = &lockdv1.StreamResponse_Cancel{Cancel: r}
			}
		case *lockdv1.StreamRequest_Complete:
			var r *lockdv1.CompleteResponse
			if r, err = unaryCall(ctx, a, b.Complete, a.Complete); err == nil {
				resp.Body = &lockdv1.StreamResponse_Complete{Complete: r}
			}
		case *lockdv1.StreamRequest_CloseSession:
			var r *lockdv1.CloseSessionResponse
			if r, err = unaryCall(ctx, a, b.CloseSession, a.CloseSession); err == nil {
				resp.Body = &lockdv1.StreamResponse_CloseSession{CloseSession: r}
			}
		default:
			err = s.invalid("stream request without a known body")
		}
		return err
	})
	s.metrics.streamFrames.WithLabelValues(kind).Inc()
	if err != nil {
		resp.Body = &lockdv1.StreamResponse_Error{Error: streamError(err)}
	}
	resp.ClusterId = a.clusterID()
	return resp
}

// unaryCall runs a frame's request through the unary RPC's own handler
// (which serves it here on the leader, forwards it from a follower, or
// answers with the leader hint), so both paths share every rule.
func unaryCall[Req, Res any](ctx context.Context, a *api, msg *Req, rpc func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*Res, error) {
	if msg == nil {
		return nil, a.s.invalid("empty request")
	}
	r, err := rpc(ctx, connect.NewRequest(msg))
	if err != nil {
		return nil, err
	}
	return r.Msg, nil
}

// keepAliveBatch renews each session of a batch received at received. It
// is served by the leader only (a follower answers NOT_LEADER with the
// leader's URL: forwarding would not save the client anything). Leadership
// is verified once for the whole batch, after it was received, for the
// same reason as a single KeepAlive (see api_session.go).
func (h *sessionAPI) keepAliveBatch(ctx context.Context, b *lockdv1.KeepAliveBatch, received time.Time) (*lockdv1.KeepAliveBatchResponse, error) {
	s := h.a.s
	if n := len(b.GetSessions()); n == 0 || n > maxKeepAliveBatch {
		return nil, s.invalid("a keepalive batch names 1 to %d sessions, not %d", maxKeepAliveBatch, n)
	}
	url, err := s.leaderURL(http.Header{})
	if err != nil {
		return nil, err
	}
	if url != "" {
		return nil, s.detailError(connect.CodeUnavailable, "not the leader; send keepalives to "+url,
			&lockdv1.ErrorDetail{Reason: lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, LeaderApi: url})
	}
	if err := s.linearizable(); err != nil {
		return nil, s.raftError(err)
	}
	resp := &lockdv1.KeepAliveBatchResponse{Results: make([]*lockdv1.KeepAliveResult, len(b.Sessions)), ClusterId: h.a.clusterID()}
	for i, k := range b.Sessions {
		r := &lockdv1.KeepAliveResult{SessionId: k.GetSessionId()}
		resp.Results[i] = r
		if r.SessionId == "" {
			r.Error = streamError(s.invalid("session_id is required"))
			continue
		}
		if err := s.checkSession(ctx, r.SessionId, k.GetSecret()); err != nil {
			r.Error = streamError(err)
			continue
		}
		ttl, err := s.lease.KeepAlive(r.SessionId, received)
		if err != nil {
			r.Error = streamError(s.leaseError(err))
			continue
		}
		s.metrics.keepAlives.Inc()
		r.Ttl = durationpb.New(ttl)
	}
	return resp, nil
}

// streamError carries an RPC error in a frame: its Connect code, message
// and ErrorDetail.
func streamError(err error) *lockdv1.StreamError {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		ce = connect.NewError(connect.CodeOf(err), err)
	}
	se := &lockdv1.StreamError{Code: uint32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ed, ok := v.(*lockdv1.ErrorDetail); ok {
				se.Detail = ed
				break
			}
		}
	}
	return se
}

// streamHandler lifts the HTTP server's read and write timeouts (meant for
// unary requests) off a session stream, which lives as long as its client.
func streamHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		h.ServeHTTP(w, r)
	})
}

// frameKind returns a frame's kind (the metrics label) and its request,
// which guard checks like the unary call's.
func frameKind(req *lockdv1.StreamRequest) (string, any) {
	switch b := req.GetBody().(type) {
	case *lockdv1.StreamRequest_CreateSession:
		return "create_session", b.CreateSession
	case *lockdv1.StreamRequest_KeepAlive:
		return "keep_alive", b.KeepAlive
	case *lockdv1.StreamRequest_Acquire:
		return "acquire", b.Acquire
	case *lockdv1.StreamRequest_Release:
		return "release", b.Release
	case *lockdv1.StreamRequest_Cancel:
		return "cancel", b.Cancel
	case *lockdv1.StreamRequest_Complete:
		return "complete", b.Complete
	case *lockdv1.StreamRequest_CloseSession:
		return "close_session", b.CloseSession
	}
	return "invalid", nil
}
