package server

import (
	"context"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// The exported handlers serve a request on the leader, forwarding it there
// from a follower. Stale reads are served by any node from its own state.

func (a *api) CreateSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.CreateSession, func() (*connect.Response[lockdv1.CreateSessionResponse], error) { return a.createSession(ctx, req) })
}

func (a *api) KeepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.KeepAlive, func() (*connect.Response[lockdv1.KeepAliveResponse], error) { return a.keepAlive(ctx, req) })
}

func (a *api) CloseSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.CloseSession, func() (*connect.Response[lockdv1.CloseSessionResponse], error) { return a.closeSession(ctx, req) })
}

func (a *api) ListSessions(ctx context.Context, req *connect.Request[lockdv1.ListSessionsRequest]) (*connect.Response[lockdv1.ListSessionsResponse], error) {
	if req.Msg.Consistency == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return a.listSessions(ctx, req)
	}
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.ListSessions, func() (*connect.Response[lockdv1.ListSessionsResponse], error) { return a.listSessions(ctx, req) })
}

func (a *api) Acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (*connect.Response[lockdv1.AcquireResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Acquire, func() (*connect.Response[lockdv1.AcquireResponse], error) { return a.acquire(ctx, req) })
}

func (a *api) Release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Release, func() (*connect.Response[lockdv1.ReleaseResponse], error) { return a.release(ctx, req) })
}

func (a *api) Cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Cancel, func() (*connect.Response[lockdv1.CancelResponse], error) { return a.cancel(ctx, req) })
}

func (a *api) CheckToken(ctx context.Context, req *connect.Request[lockdv1.CheckTokenRequest]) (*connect.Response[lockdv1.CheckTokenResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.CheckToken, func() (*connect.Response[lockdv1.CheckTokenResponse], error) { return a.checkToken(ctx, req) })
}

func (a *api) DescribeLock(ctx context.Context, req *connect.Request[lockdv1.DescribeLockRequest]) (*connect.Response[lockdv1.DescribeLockResponse], error) {
	if req.Msg.Consistency == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return a.describeLock(ctx, req)
	}
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.DescribeLock, func() (*connect.Response[lockdv1.DescribeLockResponse], error) { return a.describeLock(ctx, req) })
}

func (a *api) ListLocks(ctx context.Context, req *connect.Request[lockdv1.ListLocksRequest]) (*connect.Response[lockdv1.ListLocksResponse], error) {
	if req.Msg.Consistency == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return a.listLocks(ctx, req)
	}
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.ListLocks, func() (*connect.Response[lockdv1.ListLocksResponse], error) { return a.listLocks(ctx, req) })
}

func (a *api) ForceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.ForceRelease, func() (*connect.Response[lockdv1.ForceReleaseResponse], error) { return a.forceRelease(ctx, req) })
}

func (a *api) Complete(ctx context.Context, req *connect.Request[lockdv1.CompleteRequest]) (*connect.Response[lockdv1.CompleteResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Complete, func() (*connect.Response[lockdv1.CompleteResponse], error) { return a.complete(ctx, req) })
}
