package lockd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// The session stream: one HTTP/2 stream per (Client, endpoint) carrying
// every session-scoped call as a frame (SessionService.Stream), instead of
// one HTTP exchange per call. It is transport only: the retry loop (do)
// runs above it unchanged, a broken stream fails its pending calls with an
// "outcome unknown" error that do retries with the same seq, and an
// endpoint where no stream can be opened (a proxy that does not pass
// HTTP/2) is used over unary HTTP/1.1 instead.

// unaryFor is how long an endpoint where no stream could be opened is used
// unary only before a stream is tried again.
const unaryFor = time.Minute

// errNoStream says a call cannot go over a stream on this endpoint now;
// the caller sends it unary.
var errNoStream = errors.New("no session stream")

// errStreamBroken marks the error of a call cut by a broken stream.
var errStreamBroken = errors.New("session stream broke; outcome unknown")

// streamSlot is an endpoint's stream state.
type streamSlot struct {
	mu        sync.Mutex
	cur       *stream
	opening   chan struct{} // closed when the open in progress ends; nil if none
	unaryTill time.Time     // no stream could be opened: unary until then
	open      atomic.Bool
}

// stream is one open session stream.
type stream struct {
	ep     *node
	st     *connect.BidiStreamForClient[lockdv1.StreamRequest, lockdv1.StreamResponse]
	cancel context.CancelFunc
	sendMu sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *lockdv1.StreamResponse
	err     error // why the stream ended; each caller gets its own connect.Error (failure)
	done    chan struct{}

	acquires chan struct{} // Acquires in flight, at most maxStreamAcquires
}

// maxStreamAcquires bounds the Acquires one stream has in flight: half of
// what the server serves at once per stream (256), so that parked long
// polls never fill the server's pool and hold up other calls.
const maxStreamAcquires = 128

// streamCall sends req on the endpoint's stream (opening it if needed)
// and waits for its answer. It returns errNoStream when the endpoint is
// to be called unary; an answer's StreamError comes back as the
// *connect.Error (with its ErrorDetail) the unary call would have given.
func (c *Client) streamCall(ctx context.Context, ep *node, req *lockdv1.StreamRequest) (*lockdv1.StreamResponse, error) {
	s, err := c.openStream(ctx, ep)
	if err != nil {
		return nil, err
	}
	return s.call(ctx, req)
}

// openStream returns the endpoint's open stream, or opens one. The slot's
// lock is never held over the network: one caller opens while the others
// wait for it as long as their own ctx allows (a keepalive must not wait
// out an Acquire's long-poll budget behind a hung dial).
func (c *Client) openStream(ctx context.Context, ep *node) (*stream, error) {
	slot := &ep.stream
	for {
		slot.mu.Lock()
		if s := slot.cur; s != nil {
			slot.mu.Unlock()
			return s, nil
		}
		if ep.sessions == nil || time.Now().Before(slot.unaryTill) || c.isClosed() {
			slot.mu.Unlock()
			return nil, errNoStream
		}
		if w := slot.opening; w != nil {
			slot.mu.Unlock()
			select {
			case <-w:
				continue // opened, or failed: look again
			case <-ctx.Done():
				return nil, openAborted(ep, ctx)
			}
		}
		w := make(chan struct{})
		slot.opening = w
		slot.mu.Unlock()

		s, unary, err := c.dialStream(ctx, ep)
		slot.mu.Lock()
		slot.opening = nil
		close(w)
		if s != nil && c.isClosed() {
			s.cancel()
			s, err = nil, errNoStream
		}
		if s != nil {
			slot.cur = s
			slot.open.Store(true)
		}
		if unary {
			slot.unaryTill = time.Now().Add(unaryFor)
		}
		slot.mu.Unlock()
		if s == nil {
			return nil, err
		}
		go s.read()
		return s, nil
	}
}

// openAborted is the error of a call whose ctx ended while it waited for
// a stream to open.
func openAborted(ep *node, ctx context.Context) error {
	return wire.CtxError(ctx, fmt.Errorf("open session stream to %s: %w", ep.url, ctx.Err()))
}

// dialStream opens a stream to ep, bounded by ctx and by the request
// timeout (not by a long poll's budget). unary reports that the server
// answered but not with a stream: HTTP/2 did not pass (a proxy), or an
// old server; the endpoint is then used unary for a while.
func (c *Client) dialStream(ctx context.Context, ep *node) (s *stream, unary bool, err error) {
	limit := c.openTimeout(ep)
	octx, ocancel := context.WithTimeout(ctx, limit)
	defer ocancel()
	sctx, cancel := context.WithCancel(context.Background())
	st := ep.sessions.Stream(sctx)
	stop := context.AfterFunc(octx, cancel) // opening is bounded by octx
	err = st.Send(nil)                      // sends the headers
	var hello *lockdv1.StreamResponse
	if err == nil {
		hello, err = st.Receive()
	}
	if !stop() || octx.Err() != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, false, openAborted(ep, ctx)
		}
		return nil, false, connect.NewError(connect.CodeUnavailable, fmt.Errorf("open session stream to %s: no answer within %v", ep.url, limit))
	}
	if err != nil {
		cancel()
		if wire.NotSent(err) || wire.ConnLost(err) || c.abandonedLately(ep) {
			// Not an answer without a stream: the connection failed
			// (or the node was abandoned lately), so retry, not unary.
			return nil, false, connect.NewError(connect.CodeUnavailable, fmt.Errorf("open session stream to %s: %w", ep.url, err))
		}
		c.logger.Info("session stream unavailable, using unary calls", "endpoint", ep.url, "err", err)
		return nil, true, errNoStream
	}
	if err := c.checkCluster(ep, hello.GetClusterId()); err != nil {
		cancel()
		return nil, false, err
	}
	return &stream{ep: ep, st: st, cancel: cancel, pending: map[uint64]chan *lockdv1.StreamResponse{}, done: make(chan struct{}),
		acquires: make(chan struct{}, maxStreamAcquires)}, false, nil
}

// read delivers answers to their calls until the stream breaks.
func (s *stream) read() {
	for {
		r, err := s.st.Receive()
		if err != nil {
			s.fail(err)
			return
		}
		s.mu.Lock()
		ch := s.pending[r.GetCallId()]
		delete(s.pending, r.GetCallId())
		s.mu.Unlock()
		if ch != nil {
			ch <- r // buffered; an answer to an abandoned call is dropped
		}
	}
}

// fail ends the stream: every pending call fails with an "outcome unknown"
// error (the retry loop re-sends each with its seq), and the endpoint's
// next call opens a new stream.
func (s *stream) fail(cause error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = fmt.Errorf("%w: %s: %w", errStreamBroken, s.ep.url, cause)
		close(s.done)
	}
	s.mu.Unlock()
	s.cancel()
	slot := &s.ep.stream
	slot.mu.Lock()
	if slot.cur == s {
		slot.cur = nil
		slot.open.Store(false)
	}
	slot.mu.Unlock()
}

// failure is the error a call sees once the stream has ended: a new
// connect.Error per call, since callers read (and connect.Error.Meta
// lazily writes) its metadata concurrently.
func (s *stream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return connect.NewError(connect.CodeUnavailable, s.err)
}

// call sends one request and waits for its answer, the stream's end or
// ctx.
func (s *stream) call(ctx context.Context, req *lockdv1.StreamRequest) (*lockdv1.StreamResponse, error) {
	if _, ok := req.GetBody().(*lockdv1.StreamRequest_Acquire); ok {
		// At most maxStreamAcquires Acquires (each may park for a long
		// poll) in flight, fewer than the server serves at once, so a
		// KeepAlive, Release or Cancel never waits behind them.
		select {
		case s.acquires <- struct{}{}:
			defer func() { <-s.acquires }()
		case <-s.done:
			return nil, s.failure()
		case <-ctx.Done():
			return nil, wire.CtxError(ctx, ctx.Err())
		}
	}
	ch := make(chan *lockdv1.StreamResponse, 1)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.failure()
	}
	s.nextID++
	id := s.nextID
	s.pending[id] = ch
	s.mu.Unlock()
	req.CallId = id
	s.sendMu.Lock()
	err := s.st.Send(req)
	s.sendMu.Unlock()
	if err != nil {
		s.fail(err)
	}
	select {
	case r := <-ch:
		if e := r.GetError(); e != nil {
			return nil, wire.FromStreamError(e)
		}
		return r, nil
	case <-s.done:
		return nil, s.failure()
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, id)
		s.mu.Unlock()
		return nil, wire.CtxError(ctx, ctx.Err())
	}
}

// closeStreams ends the client's streams (Close).
func (c *Client) closeStreams() {
	c.mu.Lock()
	eps := append([]*node(nil), c.eps...)
	c.mu.Unlock()
	for _, ep := range eps {
		ep.stream.mu.Lock()
		s := ep.stream.cur
		ep.stream.mu.Unlock()
		if s != nil {
			s.sendMu.Lock()
			_ = s.st.CloseRequest()
			s.sendMu.Unlock()
			s.fail(ErrClosed)
		}
	}
}

// callStream sends a request of method m over ep's stream, returning
// errNoStream when it must go unary.
func callStream[Req, Res any](ctx context.Context, c *Client, ep *node, m *rpcs.Method, msg *Req) (*connect.Response[Res], error) {
	r, err := c.streamCall(ctx, ep, m.Wrap(any(msg).(proto.Message)))
	if err != nil {
		return nil, err
	}
	res, ok := any(m.Unwrap(r)).(*Res)
	if !ok || res == nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("session stream: answer of call %d is of another kind", r.GetCallId()))
	}
	resp := connect.NewResponse(res)
	if id := r.GetClusterId(); id != "" {
		resp.Header().Set(endpoint.ClusterIDHeader, id)
	}
	return resp, nil
}
