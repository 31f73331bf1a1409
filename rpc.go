package lockd

import (
	"context"
	"errors"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/endpoint"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// maxLongPoll is how long one queued Acquire blocks on the server before
// the client repeats it: below the server's default cap (30 s) and common
// proxy timeouts. The client always sends an explicit poll time no longer
// than this, so it knows how long an attempt may take.
const maxLongPoll = 25 * time.Second

// rpc is one row of the per-RPC policy table: how to call a method on an
// endpoint, whether a resend after an unknown outcome is safe, and which
// lock a request names (for error messages).
type rpc[Req, Res any] struct {
	call func(*node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)
	// idempotent reports whether the server deduplicates the request (a
	// read, or a mutation with a request id or sequence number), so that a
	// resend after an unknown outcome is safe. Other requests are resent
	// only when the server surely did not take them.
	idempotent func(*Req) bool
	name       func(*Req) string
	// maxPoll is the longest long poll a request may ask the server for
	// (Acquire with wait); an attempt's time is its request time plus the
	// poll.
	maxPoll time.Duration
	// stream, when set, carries the request as a session stream frame.
	stream *viaStream[Req, Res]
}

// onLock and onCluster adapt a method of the generated clients to a row.

func onLock[Req, Res any](m func(lockdv1connect.LockServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) func(*node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
	return func(ep *node, ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
		return m(ep.unary(), ctx, r)
	}
}

func onCluster[Req, Res any](m func(lockdv1connect.ClusterServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) func(*node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
	return func(ep *node, ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
		return m(ep.cluster, ctx, r)
	}
}

func always[Req any](*Req) bool   { return true }
func never[Req any](*Req) bool    { return false }
func noName[Req any](*Req) string { return "" }

type seqd interface{ GetSeq() uint64 }

// bySeq: a request with a sequence number is deduplicated by the server.
func bySeq[Req any](m *Req) bool { return any(m).(seqd).GetSeq() != 0 }

type named interface{ GetName() string }

func lockName[Req any](m *Req) string { return any(m).(named).GetName() }

// The policy table.
var (
	rpcCreateSession = rpc[lockdv1.CreateSessionRequest, lockdv1.CreateSessionResponse]{
		call:       onLock(lockdv1connect.LockServiceClient.CreateSession),
		idempotent: func(m *lockdv1.CreateSessionRequest) bool { return m.GetRequestId() != "" },
		name:       noName[lockdv1.CreateSessionRequest],
		stream:     streamCreateSession,
	}
	rpcKeepAlive = rpc[lockdv1.KeepAliveRequest, lockdv1.KeepAliveResponse]{
		call: onLock(lockdv1connect.LockServiceClient.KeepAlive), idempotent: always[lockdv1.KeepAliveRequest], name: noName[lockdv1.KeepAliveRequest],
	}
	rpcCloseSession = rpc[lockdv1.CloseSessionRequest, lockdv1.CloseSessionResponse]{
		call: onLock(lockdv1connect.LockServiceClient.CloseSession), idempotent: bySeq[lockdv1.CloseSessionRequest], name: noName[lockdv1.CloseSessionRequest],
		stream: streamCloseSession,
	}
	rpcListSessions = rpc[lockdv1.ListSessionsRequest, lockdv1.ListSessionsResponse]{
		call: onLock(lockdv1connect.LockServiceClient.ListSessions), idempotent: always[lockdv1.ListSessionsRequest], name: noName[lockdv1.ListSessionsRequest],
	}
	rpcAcquire = rpc[lockdv1.AcquireRequest, lockdv1.AcquireResponse]{
		call: onLock(lockdv1connect.LockServiceClient.Acquire), idempotent: bySeq[lockdv1.AcquireRequest], name: lockName[lockdv1.AcquireRequest],
		maxPoll: maxLongPoll,
		stream:  streamAcquire,
	}
	rpcRelease = rpc[lockdv1.ReleaseRequest, lockdv1.ReleaseResponse]{
		call: onLock(lockdv1connect.LockServiceClient.Release), idempotent: bySeq[lockdv1.ReleaseRequest], name: lockName[lockdv1.ReleaseRequest],
		stream: streamRelease,
	}
	rpcCancel = rpc[lockdv1.CancelRequest, lockdv1.CancelResponse]{
		call: onLock(lockdv1connect.LockServiceClient.Cancel), idempotent: bySeq[lockdv1.CancelRequest], name: lockName[lockdv1.CancelRequest],
		stream: streamCancel,
	}
	rpcComplete = rpc[lockdv1.CompleteRequest, lockdv1.CompleteResponse]{
		call: onLock(lockdv1connect.LockServiceClient.Complete), idempotent: bySeq[lockdv1.CompleteRequest], name: lockName[lockdv1.CompleteRequest],
		stream: streamComplete,
	}
	rpcSetValue = rpc[lockdv1.SetValueRequest, lockdv1.SetValueResponse]{
		call: onLock(lockdv1connect.LockServiceClient.SetValue), idempotent: bySeq[lockdv1.SetValueRequest], name: lockName[lockdv1.SetValueRequest],
	}
	rpcCheckToken = rpc[lockdv1.CheckTokenRequest, lockdv1.CheckTokenResponse]{
		call: onLock(lockdv1connect.LockServiceClient.CheckToken), idempotent: always[lockdv1.CheckTokenRequest], name: lockName[lockdv1.CheckTokenRequest],
	}
	rpcDescribeLock = rpc[lockdv1.DescribeLockRequest, lockdv1.DescribeLockResponse]{
		call: onLock(lockdv1connect.LockServiceClient.DescribeLock), idempotent: always[lockdv1.DescribeLockRequest], name: lockName[lockdv1.DescribeLockRequest],
	}
	rpcListLocks = rpc[lockdv1.ListLocksRequest, lockdv1.ListLocksResponse]{
		call: onLock(lockdv1connect.LockServiceClient.ListLocks), idempotent: always[lockdv1.ListLocksRequest], name: noName[lockdv1.ListLocksRequest],
	}
	// ForceRelease carries no request id: a second one after an unknown
	// outcome could expire a session that took the lock since.
	rpcForceRelease = rpc[lockdv1.ForceReleaseRequest, lockdv1.ForceReleaseResponse]{
		call: onLock(lockdv1connect.LockServiceClient.ForceRelease), idempotent: never[lockdv1.ForceReleaseRequest], name: lockName[lockdv1.ForceReleaseRequest],
	}
	rpcStatus = rpc[lockdv1.StatusRequest, lockdv1.StatusResponse]{
		call: onLock(lockdv1connect.LockServiceClient.Status), idempotent: always[lockdv1.StatusRequest], name: noName[lockdv1.StatusRequest],
	}
	rpcJoin = rpc[lockdv1.JoinRequest, lockdv1.JoinResponse]{
		call: onCluster(lockdv1connect.ClusterServiceClient.Join), idempotent: always[lockdv1.JoinRequest], name: noName[lockdv1.JoinRequest],
	}
	// RemoveMember of a member already removed is a no-op.
	rpcRemoveMember = rpc[lockdv1.RemoveMemberRequest, lockdv1.RemoveMemberResponse]{
		call: onCluster(lockdv1connect.ClusterServiceClient.RemoveMember), idempotent: always[lockdv1.RemoveMemberRequest], name: noName[lockdv1.RemoveMemberRequest],
	}
	// A second TransferLeadership after an unknown outcome would move
	// leadership again.
	rpcTransferLeadership = rpc[lockdv1.TransferLeadershipRequest, lockdv1.TransferLeadershipResponse]{
		call: onCluster(lockdv1connect.ClusterServiceClient.TransferLeadership), idempotent: never[lockdv1.TransferLeadershipRequest], name: noName[lockdv1.TransferLeadershipRequest],
	}
)

// policyOf returns the retry policy of a request under its table row.
func (r rpc[Req, Res]) policyOf(msg *Req) policy {
	return policy{idempotent: r.idempotent(msg)}
}

// invoke calls the method with msg through the retry loop under policy p
// and checks the cluster id of every answer.
func (r rpc[Req, Res]) invoke(ctx context.Context, c *Client, p policy, msg *Req, hdr http.Header) (*connect.Response[Res], error) {
	var resp *connect.Response[Res]
	err := c.do(ctx, p, r.name(msg), func(ctx context.Context, ep *node) error {
		req := connect.NewRequest(msg)
		for k, v := range hdr {
			req.Header()[k] = v
		}
		res, err := r.send(ctx, c, ep, req)
		if err != nil {
			id := ""
			if d := errorDetail(err); d != nil {
				id = d.GetClusterId()
			}
			var ce *connect.Error
			if id == "" && errors.As(err, &ce) {
				id = ce.Meta().Get(endpoint.ClusterIDHeader)
			}
			if cerr := c.checkCluster(ep, id); cerr != nil {
				return cerr
			}
			return err
		}
		id := res.Header().Get(endpoint.ClusterIDHeader)
		if m, ok := any(res.Msg).(interface{ GetClusterId() string }); ok && m.GetClusterId() != "" {
			id = m.GetClusterId()
		}
		if err := c.checkCluster(ep, id); err != nil {
			return err
		}
		resp = res
		return nil
	})
	return resp, err
}

// send makes one attempt: over ep's session stream when the row has a
// stream form and the stream is on (and no extra headers are to be sent),
// else unary.
func (r rpc[Req, Res]) send(ctx context.Context, c *Client, ep *node, req *connect.Request[Req]) (*connect.Response[Res], error) {
	if r.stream != nil && c.cfg.stream && len(req.Header()) == 0 {
		res, err := callStream(ctx, c, ep, r.stream, req.Msg)
		if !errors.Is(err, errNoStream) {
			return res, err
		}
	}
	return r.call(ep, ctx, req)
}
