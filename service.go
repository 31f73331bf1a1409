package lockd

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// service is the raw API behind Client.Service: every method goes through
// the client's failover, retry and cluster-id checks, under its row of the
// method table (internal/rpcs, read by rpc.go).
type service struct{ c *Client }

var _ lockdv1connect.LockServiceClient = (*service)(nil)

// raw calls a method of the raw API under its table row.
func raw[Req, Res any](ctx context.Context, c *Client, r rpc[Req, Res], req *connect.Request[Req]) (*connect.Response[Res], error) {
	return r.invoke(ctx, c, r.policyOf(req.Msg), req.Msg, req.Header())
}

func (s *service) CreateSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	return raw(ctx, s.c, rpcCreateSession, req)
}

func (s *service) KeepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	return raw(ctx, s.c, rpcKeepAlive, req)
}

func (s *service) CloseSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	return raw(ctx, s.c, rpcCloseSession, req)
}

func (s *service) ListSessions(ctx context.Context, req *connect.Request[lockdv1.ListSessionsRequest]) (*connect.Response[lockdv1.ListSessionsResponse], error) {
	return raw(ctx, s.c, rpcListSessions, req)
}

// Acquire sends a waiting acquire with a poll time of at most the policy
// table's long-poll cap (25 s), so that each attempt's time is known
// whatever the server's own cap.
func (s *service) Acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (*connect.Response[lockdv1.AcquireResponse], error) {
	m := req.Msg
	p := rpcAcquire.policyOf(m)
	if pt := m.GetPollTimeout(); m.GetWait() && (pt == nil || pt.IsValid() && pt.AsDuration() >= 0) {
		p.Poll = rpcAcquire.maxPoll
		if pt != nil {
			p.Poll = min(pt.AsDuration(), rpcAcquire.maxPoll)
		}
		if pt == nil || pt.AsDuration() != p.Poll {
			m = proto.CloneOf(m)
			m.PollTimeout = durationpb.New(p.Poll)
		}
	}
	return rpcAcquire.invoke(ctx, s.c, p, m, req.Header())
}

func (s *service) Release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	return raw(ctx, s.c, rpcRelease, req)
}

func (s *service) Cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	return raw(ctx, s.c, rpcCancel, req)
}

func (s *service) CheckToken(ctx context.Context, req *connect.Request[lockdv1.CheckTokenRequest]) (*connect.Response[lockdv1.CheckTokenResponse], error) {
	return raw(ctx, s.c, rpcCheckToken, req)
}

func (s *service) DescribeLock(ctx context.Context, req *connect.Request[lockdv1.DescribeLockRequest]) (*connect.Response[lockdv1.DescribeLockResponse], error) {
	return raw(ctx, s.c, rpcDescribeLock, req)
}

func (s *service) ListLocks(ctx context.Context, req *connect.Request[lockdv1.ListLocksRequest]) (*connect.Response[lockdv1.ListLocksResponse], error) {
	return raw(ctx, s.c, rpcListLocks, req)
}

func (s *service) ForceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	return raw(ctx, s.c, rpcForceRelease, req)
}

func (s *service) Complete(ctx context.Context, req *connect.Request[lockdv1.CompleteRequest]) (*connect.Response[lockdv1.CompleteResponse], error) {
	return raw(ctx, s.c, rpcComplete, req)
}

func (s *service) Status(ctx context.Context, req *connect.Request[lockdv1.StatusRequest]) (*connect.Response[lockdv1.StatusResponse], error) {
	return raw(ctx, s.c, rpcStatus, req)
}

// clusterService is the raw membership API behind Client.ClusterService.
type clusterService struct{ c *Client }

var _ lockdv1connect.ClusterServiceClient = (*clusterService)(nil)

func (s *clusterService) Join(ctx context.Context, req *connect.Request[lockdv1.JoinRequest]) (*connect.Response[lockdv1.JoinResponse], error) {
	return raw(ctx, s.c, rpcJoin, req)
}

func (s *clusterService) RemoveMember(ctx context.Context, req *connect.Request[lockdv1.RemoveMemberRequest]) (*connect.Response[lockdv1.RemoveMemberResponse], error) {
	return raw(ctx, s.c, rpcRemoveMember, req)
}

func (s *clusterService) TransferLeadership(ctx context.Context, req *connect.Request[lockdv1.TransferLeadershipRequest]) (*connect.Response[lockdv1.TransferLeadershipResponse], error) {
	return raw(ctx, s.c, rpcTransferLeadership, req)
}

func (s *service) SetValue(ctx context.Context, req *connect.Request[lockdv1.SetValueRequest]) (*connect.Response[lockdv1.SetValueResponse], error) {
	return raw(ctx, s.c, rpcSetValue, req)
}
