package api

import (
	"context"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// lockService is the LockService handler: the RPCs of api, and the read
// RPCs of this file.
type lockService struct{ *api }

var _ lockdv1connect.LockServiceHandler = lockService{}

// Read RPCs: check a token, describe a lock, list locks, node status.

// CheckToken tells whether a token is a current grant of a lock.
func (a lockService) CheckToken(ctx context.Context, req *connect.Request[lockdv1.CheckTokenRequest]) (*connect.Response[lockdv1.CheckTokenResponse], error) {
	return viaLeader(ctx, a.api, req, lockdv1connect.LockServiceClient.CheckToken, func() (*connect.Response[lockdv1.CheckTokenResponse], error) { return a.checkToken(ctx, req) })
}

func (a lockService) checkToken(ctx context.Context, req *connect.Request[lockdv1.CheckTokenRequest]) (*connect.Response[lockdv1.CheckTokenResponse], error) {
	if err := fsm.ValidateName(req.Msg.Name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	if err := a.read(lockdv1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE); err != nil {
		return nil, err
	}
	h, ok := a.s.fsm.CheckToken(req.Msg.Name, req.Msg.Token)
	resp := &lockdv1.CheckTokenResponse{Valid: ok}
	if ok {
		resp.Mode, resp.SessionId = lockdv1.Mode(h.Mode), h.Session
	}
	return connect.NewResponse(resp), nil
}

// DescribeLock returns one lock's holders, waiters and mark.
func (a lockService) DescribeLock(ctx context.Context, req *connect.Request[lockdv1.DescribeLockRequest]) (*connect.Response[lockdv1.DescribeLockResponse], error) {
	if req.Msg.Consistency == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return a.describeLock(ctx, req)
	}
	return viaLeader(ctx, a.api, req, lockdv1connect.LockServiceClient.DescribeLock, func() (*connect.Response[lockdv1.DescribeLockResponse], error) { return a.describeLock(ctx, req) })
}

func (a lockService) describeLock(ctx context.Context, req *connect.Request[lockdv1.DescribeLockRequest]) (*connect.Response[lockdv1.DescribeLockResponse], error) {
	if err := fsm.ValidateName(req.Msg.Name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	if err := a.read(req.Msg.Consistency); err != nil {
		return nil, err
	}
	resp := &lockdv1.DescribeLockResponse{Policy: a.policyPB(req.Msg.Name)}
	if l, ok := a.s.fsm.Describe(req.Msg.Name); ok {
		resp.Lock = LockPB(l)
	}
	return connect.NewResponse(resp), nil
}

// ListLocks lists locks by name, a page at a time.
func (a lockService) ListLocks(ctx context.Context, req *connect.Request[lockdv1.ListLocksRequest]) (*connect.Response[lockdv1.ListLocksResponse], error) {
	if req.Msg.Consistency == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return a.listLocks(ctx, req)
	}
	return viaLeader(ctx, a.api, req, lockdv1connect.LockServiceClient.ListLocks, func() (*connect.Response[lockdv1.ListLocksResponse], error) { return a.listLocks(ctx, req) })
}

func (a lockService) listLocks(ctx context.Context, req *connect.Request[lockdv1.ListLocksRequest]) (*connect.Response[lockdv1.ListLocksResponse], error) {
	m := req.Msg
	n := int(m.PageSize)
	switch {
	case n == 0:
		n = 100
	case n > 1000:
		return nil, a.s.errs.Invalid("page_size %d is above 1000", n)
	}
	if len(m.Prefix) > fsm.MaxNameBytes || len(m.PageToken) > fsm.MaxNameBytes {
		return nil, a.s.errs.Invalid("prefix or page_token longer than %d bytes", fsm.MaxNameBytes)
	}
	if err := a.read(m.Consistency); err != nil {
		return nil, err
	}
	locks, more := a.s.fsm.List(m.Prefix, m.PageToken, n)
	resp := &lockdv1.ListLocksResponse{}
	for _, l := range locks {
		resp.Locks = append(resp.Locks, LockPB(l))
	}
	if more && len(locks) > 0 {
		resp.NextPageToken = locks[len(locks)-1].Name
	}
	return connect.NewResponse(resp), nil
}

// Status reports this node's view of the cluster (served locally).
func (a lockService) Status(ctx context.Context, req *connect.Request[lockdv1.StatusRequest]) (*connect.Response[lockdv1.StatusResponse], error) {
	s := a.s
	info := s.fsm.Info()
	leader := s.cluster.Leader()
	resp := &lockdv1.StatusResponse{
		NodeId: s.nodeID, Leader: string(leader), State: s.cluster.State().String(), Term: s.cluster.Term(),
		CommitIndex: s.cluster.CommitIndex(), AppliedIndex: s.cluster.AppliedIndex(),
		Sessions: uint32(info.Sessions), Locks: uint32(info.Locks), ClusterId: info.ClusterID, LastToken: info.LastToken, Version: s.version,
	}
	resp.Members = s.node.Members()
	resp.ApplyVersion, resp.ClusterVersion = s.versions.ApplyVersion(), s.fsm.ClusterVersion()
	return connect.NewResponse(resp), nil
}
