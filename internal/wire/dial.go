package wire

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// StreamCall sends req on the endpoint's stream (opening it if needed)
// and waits for its answer. It returns ErrNoStream when the endpoint is
// to be called unary; an answer's StreamError comes back as the
// *connect.Error (with its ErrorDetail) the unary call would have given.
func (c *Caller) StreamCall(ctx context.Context, ep *Node, req *lockdv1.StreamRequest) (*lockdv1.StreamResponse, error) {
	s, err := c.OpenStream(ctx, ep)
	if err != nil {
		return nil, err
	}
	return s.Call(ctx, req)
}

// OpenStream returns ep's open stream, or opens one (StreamSlot.Open).
func (c *Caller) OpenStream(ctx context.Context, ep *Node) (*Stream, error) {
	return ep.Stream.Open(ctx, ep.Sessions != nil, c.Closed,
		func(ctx context.Context) (*Stream, bool, error) { return c.dialStream(ctx, ep) },
		func(ctx context.Context) error { return openAborted(ep, ctx) })
}

// openAborted is the error of a call whose ctx ended while it waited for
// a stream to open.
func openAborted(ep *Node, ctx context.Context) error {
	return CtxError(ctx, fmt.Errorf("open session stream to %s: %w", ep.URL, ctx.Err()))
}

// dialStream opens a stream to ep, bounded by ctx and by the request
// timeout (not by a long poll's budget). unary reports that the server
// answered but not with a stream: HTTP/2 did not pass (a proxy), or an
// old server; the endpoint is then used unary for a while.
func (c *Caller) dialStream(ctx context.Context, ep *Node) (s *Stream, unary bool, err error) {
	limit := c.Eps.OpenTimeout(ep, c.RequestTimeout)
	octx, ocancel := context.WithTimeout(ctx, limit)
	defer ocancel()
	sctx, cancel := context.WithCancel(context.Background())
	sctx, more := withMoreHint(sctx)
	sctx, upgraded := withUpgradeMark(sctx)
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
		if NotSent(err) || ConnLost(err) || c.Eps.AbandonedLately(ep) {
			// Not an answer without a stream: the connection failed
			// (or the node was abandoned lately), so retry, not unary.
			return nil, false, connect.NewError(connect.CodeUnavailable, fmt.Errorf("open session stream to %s: %w", ep.URL, err))
		}
		c.Logger.Info("session stream unavailable, using unary calls", "endpoint", ep.URL, "err", err)
		return nil, true, ErrNoStream
	}
	if err := c.Eps.CheckCluster(ep, hello.GetClusterId()); err != nil {
		cancel()
		return nil, false, err
	}
	s = NewStream(ep.URL, &ep.Stream, st, cancel)
	s.more = more
	s.notice = c.OnNotice
	if upgraded.Load() {
		s.watchSilence() // no HTTP/2 pings on this connection
	}
	return s, false, nil
}

// CloseStreams ends the client's streams (Close).
func (c *Caller) CloseStreams() {
	for _, ep := range c.Eps.All() {
		if s := ep.Stream.Current(); s != nil {
			s.Close(ErrClosed)
		}
	}
}

// CallStream sends a request of method m over ep's stream, returning
// ErrNoStream when it must go unary; the answer comes with the cluster id
// the server sent with it.
func CallStream[Req, Res any](ctx context.Context, c *Caller, ep *Node, m *rpcs.Method, msg *Req) (*Res, string, error) {
	r, err := c.StreamCall(ctx, ep, wrapFrame(m, any(msg).(proto.Message)))
	if err != nil {
		return nil, "", err
	}
	res, ok := answerOf(m, r).(*Res)
	if !ok || res == nil {
		return nil, "", connect.NewError(connect.CodeInternal, fmt.Errorf("session stream: answer of call %d is of another kind", r.GetCallId()))
	}
	return res, r.GetClusterId(), nil
}
