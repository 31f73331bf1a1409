package lockd

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// The session stream (internal/wire's Stream): one HTTP/2 stream per (Client, endpoint) carrying
// every session-scoped call as a frame (SessionService.Stream), instead of
// one HTTP exchange per call. It is transport only: the retry loop (wire.Caller.Do)
// runs above it unchanged, a broken stream fails its pending calls with an
// "outcome unknown" error that do retries with the same seq, and an
// endpoint where no stream can be opened (a proxy that does not pass
// HTTP/2) is used over unary HTTP/1.1 instead.

// streamCall sends req on the endpoint's stream (opening it if needed)
// and waits for its answer. It returns wire.ErrNoStream when the endpoint is
// to be called unary; an answer's StreamError comes back as the
// *connect.Error (with its ErrorDetail) the unary call would have given.
func (c *Client) streamCall(ctx context.Context, ep *wire.Node, req *lockdv1.StreamRequest) (*lockdv1.StreamResponse, error) {
	s, err := c.openStream(ctx, ep)
	if err != nil {
		return nil, err
	}
	return s.Call(ctx, req)
}

// openStream returns ep's open stream, or opens one (wire.StreamSlot.Open).
func (c *Client) openStream(ctx context.Context, ep *wire.Node) (*wire.Stream, error) {
	return ep.Stream.Open(ctx, ep.Sessions != nil, c.isClosed,
		func(ctx context.Context) (*wire.Stream, bool, error) { return c.dialStream(ctx, ep) },
		func(ctx context.Context) error { return openAborted(ep, ctx) })
}

// openAborted is the error of a call whose ctx ended while it waited for
// a stream to open.
func openAborted(ep *wire.Node, ctx context.Context) error {
	return wire.CtxError(ctx, fmt.Errorf("open session stream to %s: %w", ep.URL, ctx.Err()))
}

// dialStream opens a stream to ep, bounded by ctx and by the request
// timeout (not by a long poll's budget). unary reports that the server
// answered but not with a stream: HTTP/2 did not pass (a proxy), or an
// old server; the endpoint is then used unary for a while.
func (c *Client) dialStream(ctx context.Context, ep *wire.Node) (s *wire.Stream, unary bool, err error) {
	limit := c.eps.OpenTimeout(ep, c.cfg.requestTimeout)
	octx, ocancel := context.WithTimeout(ctx, limit)
	defer ocancel()
	sctx, cancel := context.WithCancel(context.Background())
	st := ep.Sessions.Stream(sctx)
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
		return nil, false, connect.NewError(connect.CodeUnavailable, fmt.Errorf("open session stream to %s: no answer within %v", ep.URL, limit))
	}
	if err != nil {
		cancel()
		if wire.NotSent(err) || wire.ConnLost(err) || c.eps.AbandonedLately(ep) {
			// Not an answer without a stream: the connection failed
			// (or the node was abandoned lately), so retry, not unary.
			return nil, false, connect.NewError(connect.CodeUnavailable, fmt.Errorf("open session stream to %s: %w", ep.URL, err))
		}
		c.logger.Info("session stream unavailable, using unary calls", "endpoint", ep.URL, "err", err)
		return nil, true, wire.ErrNoStream
	}
	if err := c.eps.CheckCluster(ep, hello.GetClusterId()); err != nil {
		cancel()
		return nil, false, err
	}
	return wire.NewStream(ep.URL, &ep.Stream, st, cancel), false, nil
}

// closeStreams ends the client's streams (Close).
func (c *Client) closeStreams() {
	for _, ep := range c.eps.All() {
		if s := ep.Stream.Current(); s != nil {
			s.Close(ErrClosed)
		}
	}
}

// callStream sends a request of method m over ep's stream, returning
// wire.ErrNoStream when it must go unary.
func callStream[Req, Res any](ctx context.Context, c *Client, ep *wire.Node, m *rpcs.Method, msg *Req) (*connect.Response[Res], error) {
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
