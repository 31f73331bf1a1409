package lockd

import (
	"context"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// maxPoll is the server's cap on an Acquire long poll.
const maxPoll = 30 * time.Second

// service is the raw API behind Client.Service: every method goes through
// the client's failover, retry and cluster-id checks.
type service struct{ c *Client }

var _ lockdv1connect.LockServiceClient = (*service)(nil)

func (s *service) CreateSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	p := unsafe
	if req.Msg.GetRequestId() != "" {
		p = safe
	}
	return invoke(ctx, s.c, p, "", req.Msg, req.Header(), lockdv1connect.LockServiceClient.CreateSession)
}

func (s *service) KeepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	return invoke(ctx, s.c, safe, "", req.Msg, req.Header(), lockdv1connect.LockServiceClient.KeepAlive)
}

func (s *service) CloseSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	return invoke(ctx, s.c, seqPolicy(req.Msg.GetSeq()), "", req.Msg, req.Header(), lockdv1connect.LockServiceClient.CloseSession)
}

func (s *service) ListSessions(ctx context.Context, req *connect.Request[lockdv1.ListSessionsRequest]) (*connect.Response[lockdv1.ListSessionsResponse], error) {
	return invoke(ctx, s.c, safe, "", req.Msg, req.Header(), lockdv1connect.LockServiceClient.ListSessions)
}

func (s *service) Acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (*connect.Response[lockdv1.AcquireResponse], error) {
	p := seqPolicy(req.Msg.GetSeq())
	if req.Msg.GetWait() {
		poll := req.Msg.GetPollTimeout().AsDuration()
		if poll <= 0 || poll > maxPoll {
			poll = maxPoll
		}
		p.timeout = s.c.cfg.requestTimeout + poll
	}
	return invoke(ctx, s.c, p, req.Msg.GetName(), req.Msg, req.Header(), lockdv1connect.LockServiceClient.Acquire)
}

func (s *service) Release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	return invoke(ctx, s.c, seqPolicy(req.Msg.GetSeq()), req.Msg.GetName(), req.Msg, req.Header(), lockdv1connect.LockServiceClient.Release)
}

func (s *service) Cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	return invoke(ctx, s.c, seqPolicy(req.Msg.GetSeq()), req.Msg.GetName(), req.Msg, req.Header(), lockdv1connect.LockServiceClient.Cancel)
}

func (s *service) CheckToken(ctx context.Context, req *connect.Request[lockdv1.CheckTokenRequest]) (*connect.Response[lockdv1.CheckTokenResponse], error) {
	return invoke(ctx, s.c, safe, req.Msg.GetName(), req.Msg, req.Header(), lockdv1connect.LockServiceClient.CheckToken)
}

func (s *service) DescribeLock(ctx context.Context, req *connect.Request[lockdv1.DescribeLockRequest]) (*connect.Response[lockdv1.DescribeLockResponse], error) {
	return invoke(ctx, s.c, safe, req.Msg.GetName(), req.Msg, req.Header(), lockdv1connect.LockServiceClient.DescribeLock)
}

func (s *service) ListLocks(ctx context.Context, req *connect.Request[lockdv1.ListLocksRequest]) (*connect.Response[lockdv1.ListLocksResponse], error) {
	return invoke(ctx, s.c, safe, "", req.Msg, req.Header(), lockdv1connect.LockServiceClient.ListLocks)
}

func (s *service) ForceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	return invoke(ctx, s.c, unsafe, req.Msg.GetName(), req.Msg, req.Header(), lockdv1connect.LockServiceClient.ForceRelease)
}

func (s *service) Complete(ctx context.Context, req *connect.Request[lockdv1.CompleteRequest]) (*connect.Response[lockdv1.CompleteResponse], error) {
	return invoke(ctx, s.c, seqPolicy(req.Msg.GetSeq()), req.Msg.GetName(), req.Msg, req.Header(), lockdv1connect.LockServiceClient.Complete)
}

func (s *service) Status(ctx context.Context, req *connect.Request[lockdv1.StatusRequest]) (*connect.Response[lockdv1.StatusResponse], error) {
	return invoke(ctx, s.c, safe, "", req.Msg, req.Header(), lockdv1connect.LockServiceClient.Status)
}

// seqPolicy: a request with a sequence number is deduplicated by the server.
func seqPolicy(seq uint64) policy {
	if seq != 0 {
		return safe
	}
	return unsafe
}
