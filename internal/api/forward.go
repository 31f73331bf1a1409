package api

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/guard"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// ForwardedHeader marks a request a follower forwarded to the leader. A node
// never forwards such a request again, so a stale view of the leader cannot
// make requests loop.
const ForwardedHeader = guard.ForwardedHeader

// ForwardedIdentityHeader carries the original caller's identity on a call
// a follower forwards to the leader (see internal/guard).
const ForwardedIdentityHeader = guard.ForwardedIdentityHeader

// leaderURL decides where a request that needs the leader is served: ""
// means here (this node is the leader), else the leader's API URL. A node
// that is not the leader and cannot forward answers an unavailable error
// the client retries.
func (s *Server) leaderURL(h http.Header) (string, error) {
	if s.cluster.State() == raft.Leader {
		return "", nil
	}
	if h.Get(ForwardedHeader) != "" {
		return "", s.errs.RaftError(raft.ErrNotLeader)
	}
	id := s.node.HeardLeader()
	if id == "" {
		return "", s.errs.RaftError(raft.ErrNotLeader)
	}
	m, ok := s.fsm.Member(string(id))
	if !ok || m.API == "" || m.ID == s.nodeID {
		return "", s.errs.APIError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, "leader "+string(id)+" has no known API address yet; retry")
	}
	return m.API, nil
}

// forward sends a request to the leader's API with the caller's context
// (deadline and cancellation) and returns the leader's answer or error as
// is, error details included.
func forward[Req, Res any, C any](ctx context.Context, s *Server, url string, client C, req *connect.Request[Req],
	call func(C, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	out := connect.NewRequest(req.Msg)
	out.Header().Set(ForwardedHeader, s.nodeID)
	s.guard.PeerHeaders(ctx, out.Header())
	s.metrics.forwarded.Inc()
	// A leader that stops answering (frozen, cut off) keeps the
	// connection open: the forward would wait on it for the caller's
	// whole deadline, a long poll's included, while the cluster elects
	// another. It ends when this node sees the leader change — except a
	// leadership transfer's, which changes the leader itself and is
	// answered by the old leader right after.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var moved atomic.Bool
	if req.Spec().Procedure != lockdv1connect.ClusterServiceTransferLeadershipProcedure {
		stop := afterClose(s.fwd.LeaderMoved(), func() { moved.Store(true); cancel() })
		defer stop()
	}
	resp, err := call(client, fctx, out)
	if err != nil {
		if ctx.Err() == nil && !answeredByServer(err) {
			// The leader never answered (transport error): a write's outcome
			// is unknown; the client retries with the same request id.
			hint, msg := url, "forward to leader "+url+": "+err.Error()
			if moved.Load() {
				hint, _ = s.leaderURL(nil) // the new one, if known
				if hint == "" && s.cluster.State() == raft.Leader {
					hint = s.apiURL
				}
				msg = "forward to leader " + url + " ended: the leader changed; retry"
			}
			return nil, s.errs.DetailError(connect.CodeUnavailable, msg,
				&lockdv1.ErrorDetail{Reason: lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN, LeaderApi: hint})
		}
		return nil, err // the leader's own answer, details included
	}
	return connect.NewResponse(resp.Msg), nil
}

// afterClose runs f once ch is closed, unless stop is called first.
func afterClose(ch <-chan struct{}, f func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			f()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// answeredByServer reports whether err is an error a lockd node returned:
// those always carry an ErrorDetail.
func answeredByServer(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if _, ok := v.(*lockdv1.ErrorDetail); ok {
				return true
			}
		}
	}
	return false
}

// viaLeader serves a LockService request here when this node is the leader,
// or forwards it.
func viaLeader[Req, Res any](ctx context.Context, a *api, req *connect.Request[Req],
	call func(lockdv1connect.LockServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
	local func() (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	url, err := a.s.leaderURL(req.Header())
	if err != nil {
		return nil, err
	}
	if url == "" {
		return local()
	}
	return forward(ctx, a.s, url, a.s.fwd.LockClient(url), req, call)
}
