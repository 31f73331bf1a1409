package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/rpcs"
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

// maxKeepAliveBatch bounds the sessions of one KeepAliveBatch (the client
// splits larger rounds, and splits by size so that a frame stays under
// maxRequestBytes: 1000 sessions with their secrets would not).
const maxKeepAliveBatch = 1000

// streamEpoch anchors the streams' monotonic write stamps.
var streamEpoch = time.Now()

// maxIdleWorkers bounds the workers of one stream kept waiting for its next
// call (see streamServer.work).
const maxIdleWorkers = 4

// sessionAPI implements lockdv1connect.SessionServiceHandler.
type sessionAPI struct{ a *api }

var _ lockdv1connect.SessionServiceHandler = (*sessionAPI)(nil)

// Frame kinds are indexes in streamKinds: the method table's frames
// (internal/rpcs) in table order, then kindInvalid.
var kindInvalid = len(rpcs.Frames())

// streamKinds are the values of the kind label of
// lockd_api_stream_frames_total, by frame kind.
var streamKinds = func() []string {
	var ks []string
	for _, m := range rpcs.Frames() {
		ks = append(ks, string(m.Frame))
	}
	return append(ks, "invalid")
}()

// kindOf is the index in streamKinds of each frame kind.
var kindOf = func() map[*rpcs.Method]int {
	ks := map[*rpcs.Method]int{}
	for i, m := range rpcs.Frames() {
		ks[m] = i
	}
	return ks
}()

// streamServer is one stream being served. The goroutine that reads a
// frame serves it, having first handed the reading on to an idle worker
// (or a new one): no hand-off lies between a frame and its proposal. Each
// answer is written by a worker that made one (stream_write.go) rather than
// handed to a writer goroutine, and a worker stays to read and serve the
// stream's next calls rather than a goroutine being started per call:
// under workload own these hand-offs and the stack growth of fresh
// goroutines cost more server CPU than the stream's own code.
type streamServer struct {
	h          *sessionAPI
	st         *connect.BidiStream[lockdv1.StreamRequest, lockdv1.StreamResponse]
	ctx        context.Context
	cancel     context.CancelFunc
	waitSlots  chan struct{}
	shortSlots chan struct{}
	reading    chan struct{} // unbuffered: the reading passes only to an idle worker
	idle       atomic.Int32
	readErr    chan<- error
	quit       <-chan struct{}

	mu      sync.Mutex // guards stopped and orders calls.Add before calls.Wait
	stopped bool
	calls   sync.WaitGroup

	sendMu    sync.Mutex // held by the worker writing answers
	sendErr   error
	upgraded  bool         // on an upgraded connection: heartbeats (upgrade.go)
	lastWrite atomic.Int64 // upgraded only: when answers were last written, in ns since streamEpoch
	queue     answerQueue
	gate      *flushGate // nil: every answer flushed on its own

	notices noticeSink // the sessions whose release requests it delivers (notices.go)
}

// Stream serves one session stream: a reader goroutine hands each frame to
// a worker (at most streamInFlight calls in flight per pool), each worker
// writes its own answer, and this goroutine ends the stream.
func (h *sessionAPI) Stream(ctx context.Context, st *connect.BidiStream[lockdv1.StreamRequest, lockdv1.StreamResponse]) error {
	s := h.a.s
	// Opening needs what CreateSession needs, and one of the caller's
	// stream slots; access is judged again when the auth rules change.
	aw, release, err := s.guard.OpenStream(ctx)
	if err != nil {
		return err
	}
	defer release()
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
	// Frames are read by workers, not by this goroutine, so that a
	// shutdown of this node ends the stream at once (the client goes
	// elsewhere) instead of keeping it served until the HTTP server's
	// shutdown times out.
	readErr := make(chan error, 1)
	quit := make(chan struct{})
	sv := &streamServer{
		h: h, st: st, ctx: ctx, cancel: cancel,
		waitSlots:  make(chan struct{}, streamInFlight),
		shortSlots: make(chan struct{}, streamInFlight),
		reading:    make(chan struct{}),
		readErr:    readErr,
		quit:       quit,
		gate:       gateOf(ctx),
	}
	sv.ctx = context.WithValue(ctx, streamKey{}, sv)
	sv.upgraded = isUpgraded(ctx)
	sv.lastWrite.Store(time.Since(streamEpoch).Nanoseconds()) // the open frame
	go sv.work()
	beats := make(chan struct{})
	if sv.upgraded {
		go sv.heartbeats(beats)
	} else {
		close(beats)
	}
	var rerr error
	for ended := false; !ended; {
		select {
		case err := <-readErr:
			if !errors.Is(err, io.EOF) {
				rerr = err
			}
			ended = true
			if sv.upgraded {
				// The client never half-closes an upgraded connection:
				// its end means the client is gone, so its parked calls
				// are cancelled (HTTP/2 cancels them on RST_STREAM).
				cancel()
			}
		case <-ctx.Done():
			ended = true
		case <-s.done:
			rerr, ended = s.errs.RaftError(raft.ErrRaftShutdown), true
			cancel()
		case <-aw.Changed():
			// A reload: the stream ends (PERMISSION_DENIED) if its caller
			// lost its token or every lock grant; the frames already
			// answer to the new rules (guard). Its calls in flight are
			// cancelled, so a queued Acquire of a revoked caller is not
			// granted later.
			if err := s.guard.Recheck(ctx, &aw); err != nil {
				rerr, ended = err, true
				cancel()
			}
		}
	}
	close(quit)
	<-beats
	sv.mu.Lock()
	sv.stopped = true
	sv.mu.Unlock()
	sv.calls.Wait()
	sv.notices.stop()
	close(sv.reading)
	sv.sendMu.Lock()
	defer sv.sendMu.Unlock()
	// Answers a worker queued while another was letting go of the writer
	// are written here.
	sv.writeQueued()
	if rerr != nil {
		return rerr
	}
	return sv.sendErr
}

// heartbeats sends, on a stream of an upgraded connection, where no
// HTTP/2 ping tells the client this node is alive, a frame with call_id 0
// and no body whenever nothing was written for HeartbeatEvery (checked
// every half interval, so a live node is heard every 1.5 intervals at
// most); it returns when the stream ends (quit), closing done.
func (sv *streamServer) heartbeats(done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(HeartbeatEvery / 2)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if time.Duration(time.Since(streamEpoch).Nanoseconds()-sv.lastWrite.Load()) >= HeartbeatEvery {
				sv.answer(&lockdv1.StreamResponse{}, nil)
			}
		case <-sv.quit:
			return
		}
	}
}

// work reads a frame (once its pool has a slot: the reading stops while
// the pool of the next frame is full, see streamInFlight), hands the
// reading on, serves the frame, and then waits to read again for as long
// as it is one of at most maxIdleWorkers idle ones: a worker's stack has
// already grown to what a call needs, where a new goroutine's would grow
// again.
func (sv *streamServer) work() {
	for {
		req, err := sv.st.Receive()
		if err != nil {
			sv.readErr <- err
			return
		}
		slots := sv.shortSlots
		if _, ok := req.GetBody().(*lockdv1.StreamRequest_Acquire); ok {
			slots = sv.waitSlots
		}
		select {
		case slots <- struct{}{}:
		case <-sv.ctx.Done():
			return
		case <-sv.quit:
			return
		}
		received := time.Now()
		if !sv.handOn() {
			<-slots
			return
		}
		resp := sv.h.serve(sv.ctx, req, received)
		sv.answer(resp, slots)
		if resp.GetSubscribeNotices() != nil {
			sv.notices.started(req.GetSubscribeNotices().GetSessionId())
		}
		sv.calls.Done()
		if sv.idle.Add(1) > maxIdleWorkers {
			sv.idle.Add(-1)
			return
		}
		_, ok := <-sv.reading
		sv.idle.Add(-1)
		if !ok {
			return
		}
	}
}

// handOn counts a call in flight and passes the reading to an idle worker
// or a new one; false once the stream is ending (the call is dropped, as
// the client is going away).
func (sv *streamServer) handOn() bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.stopped {
		return false
	}
	sv.calls.Add(1)
	select {
	case sv.reading <- struct{}{}:
	default:
		go sv.work()
	}
	return true
}

// serve answers one frame; it never fails, an error is an answer too.
func (h *sessionAPI) serve(ctx context.Context, req *lockdv1.StreamRequest, received time.Time) *lockdv1.StreamResponse {
	s := h.a.s
	resp := &lockdv1.StreamResponse{CallId: req.GetCallId()}
	var err error
	if req.GetCallId() == 0 {
		// Not served: its answer could not be told from the open frame.
		s.metrics.streamFrameOf[kindInvalid].Inc()
		err = s.errs.Invalid("call_id 0 is reserved")
	} else {
		kind, msg, call := h.frameCall(req, resp, received)
		err = s.guard.Run(ctx, msg, streamKinds[kind], call)
		s.metrics.streamFrameOf[kind].Inc()
		if le, ok := err.(*guard.LimitError); ok && le.Held() {
			guard.Hold(ctx)
		}
	}
	if err != nil {
		resp.Body = &lockdv1.StreamResponse_Error{Error: StreamError(err)}
	}
	resp.ClusterId = h.a.clusterID()
	return resp
}

// frameCall returns a frame's kind, its request (which guard checks like
// the unary call's) and the call that answers it into resp: the frame's
// row of the method table says its kind, frameHandlers serves it. An error
// replaces the answer.
func (h *sessionAPI) frameCall(req *lockdv1.StreamRequest, resp *lockdv1.StreamResponse, received time.Time) (int, any, func(context.Context) error) {
	a := h.a
	m, msg := rpcs.FrameOf(req)
	serve := frameHandlers[m]
	if m == nil || serve == nil {
		if req.GetBody() == nil {
			return kindInvalid, nil, func(context.Context) error { return a.s.errs.Invalid("stream request without a body") }
		}
		return kindInvalid, nil, func(context.Context) error { return a.s.errs.Invalid("stream request without a known body") }
	}
	return kindOf[m], msg, func(ctx context.Context) error {
		if !msg.ProtoReflect().IsValid() {
			return a.s.errs.Invalid("empty request")
		}
		out, err := serve(ctx, h, msg, received)
		if err != nil {
			return err
		}
		m.SetAnswer(resp, out)
		return nil
	}
}

// frameHandler serves one frame's request.
type frameHandler func(ctx context.Context, h *sessionAPI, msg proto.Message, received time.Time) (proto.Message, error)

// frameHandlers serve each frame kind of the method table: through the
// unary RPC's own handler (which serves it here on the leader, forwards it
// from a follower, or answers with the leader hint), so both paths share
// every rule; only KeepAlive has its own batched form.
var frameHandlers = map[*rpcs.Method]frameHandler{
	rpcs.ByName("CreateSession"):    unary((*api).CreateSession),
	rpcs.ByName("Acquire"):          unary((*api).Acquire),
	rpcs.ByName("Release"):          unary((*api).Release),
	rpcs.ByName("Cancel"):           unary((*api).Cancel),
	rpcs.ByName("Complete"):         unary((*api).Complete),
	rpcs.ByName("CloseSession"):     unary((*api).CloseSession),
	rpcs.ByName("SubscribeNotices"): subscribeNotices,
	rpcs.ByName("KeepAlive"): func(ctx context.Context, h *sessionAPI, msg proto.Message, received time.Time) (proto.Message, error) {
		return h.keepAliveBatch(ctx, msg.(*lockdv1.KeepAliveBatch), received)
	},
}

// unary adapts a unary handler of the API to a frame handler.
func unary[Req, Res any, PReq interface {
	*Req
	proto.Message
}, PRes interface {
	*Res
	proto.Message
}](call func(*api, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) frameHandler {
	return func(ctx context.Context, h *sessionAPI, msg proto.Message, _ time.Time) (proto.Message, error) {
		r, err := call(h.a, ctx, connect.NewRequest((*Req)(msg.(PReq))))
		if err != nil {
			return nil, err
		}
		return PRes(r.Msg), nil
	}
}

// keepAliveBatch renews each session of a batch received at received. It
// is served by the leader only (a follower answers NOT_LEADER with the
// leader's URL: forwarding would not save the client anything). Leadership
// is verified once for the whole batch, after it was received, for the
// same reason as a single KeepAlive (see api_session.go).
func (h *sessionAPI) keepAliveBatch(ctx context.Context, b *lockdv1.KeepAliveBatch, received time.Time) (*lockdv1.KeepAliveBatchResponse, error) {
	s := h.a.s
	if n := len(b.GetSessions()); n == 0 || n > maxKeepAliveBatch {
		return nil, s.errs.Invalid("a keepalive batch names 1 to %d sessions, not %d", maxKeepAliveBatch, n)
	}
	url, err := s.leaderURL(http.Header{})
	if err != nil {
		return nil, err
	}
	if url != "" {
		return nil, s.errs.DetailError(connect.CodeUnavailable, "not the leader; send keepalives to "+url,
			&lockdv1.ErrorDetail{Reason: lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, LeaderApi: url})
	}
	if err := s.node.Linearizable(); err != nil {
		return nil, s.errs.RaftError(err)
	}
	resp := &lockdv1.KeepAliveBatchResponse{Results: make([]*lockdv1.KeepAliveResult, len(b.Sessions)), ClusterId: h.a.clusterID()}
	// The results in one block, and one Duration for the TTLs that are
	// equal (sessions renewed together mostly share theirs): a batch's
	// answer allocates per batch, not per session. The answer is only
	// marshalled, so the results may share it.
	block := make([]lockdv1.KeepAliveResult, len(b.Sessions))
	var lastTTL time.Duration
	var ttlMsg *durationpb.Duration
	for i, k := range b.Sessions {
		r := &block[i]
		r.SessionId = k.GetSessionId()
		resp.Results[i] = r
		if r.SessionId == "" {
			r.Error = StreamError(s.errs.Invalid("session_id is required"))
			continue
		}
		if err := s.checkSession(ctx, r.SessionId, k.GetSecret()); err != nil {
			r.Error = StreamError(err)
			continue
		}
		ttl, err := s.lease.KeepAlive(r.SessionId, received)
		if err != nil {
			r.Error = StreamError(s.errs.LeaseError(err))
			continue
		}
		s.metrics.keepAlives.Inc()
		if ttlMsg == nil || ttl != lastTTL {
			ttlMsg, lastTTL = durationpb.New(ttl), ttl
		}
		r.Ttl = ttlMsg
	}
	return resp, nil
}

// StreamError carries an RPC error in a frame: its Connect code, message
// and ErrorDetail.
func StreamError(err error) *lockdv1.StreamError {
	if le, ok := err.(*guard.LimitError); ok {
		return le.StreamError()
	}
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
