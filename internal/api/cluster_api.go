package api

import (
	"context"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// clusterAPI implements lockdv1connect.ClusterServiceHandler.
type clusterAPI struct{ *Server }

var _ lockdv1connect.ClusterServiceHandler = clusterAPI{}

func viaLeaderCluster[Req, Res any](ctx context.Context, c clusterAPI, req *connect.Request[Req],
	call func(lockdv1connect.ClusterServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
	local func() (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	url, err := c.leaderURL(req.Header())
	if err != nil {
		return nil, err
	}
	if url == "" {
		return local()
	}
	return forward(ctx, c.Server, url, c.fwd.ClusterClient(url), req, call)
}

// Join adds a node to the cluster (on the leader, forwarded from a follower).
func (c clusterAPI) Join(ctx context.Context, req *connect.Request[lockdv1.JoinRequest]) (*connect.Response[lockdv1.JoinResponse], error) {
	return viaLeaderCluster(ctx, c, req, lockdv1connect.ClusterServiceClient.Join, func() (*connect.Response[lockdv1.JoinResponse], error) {
		return c.join(ctx, req.Msg)
	})
}

// RemoveMember removes a member from the Raft configuration.
func (c clusterAPI) RemoveMember(ctx context.Context, req *connect.Request[lockdv1.RemoveMemberRequest]) (*connect.Response[lockdv1.RemoveMemberResponse], error) {
	return viaLeaderCluster(ctx, c, req, lockdv1connect.ClusterServiceClient.RemoveMember, func() (*connect.Response[lockdv1.RemoveMemberResponse], error) {
		if err := c.removeMember(req.Msg.NodeId); err != nil {
			return nil, err
		}
		return connect.NewResponse(&lockdv1.RemoveMemberResponse{}), nil
	})
}

// TransferLeadership hands leadership to a voter (one given, or any).
func (c clusterAPI) TransferLeadership(ctx context.Context, req *connect.Request[lockdv1.TransferLeadershipRequest]) (*connect.Response[lockdv1.TransferLeadershipResponse], error) {
	return viaLeaderCluster(ctx, c, req, lockdv1connect.ClusterServiceClient.TransferLeadership, func() (*connect.Response[lockdv1.TransferLeadershipResponse], error) {
		s := c
		var addr raft.ServerAddress
		if id := req.Msg.NodeId; id != "" {
			a, ok := s.node.VoterAddress(id)
			if !ok {
				return nil, s.errs.Invalid("node %q is not a voter of this cluster", id)
			}
			addr = a
		}
		if err := s.cluster.TransferLeadership(raft.ServerID(req.Msg.NodeId), addr); err != nil {
			return nil, s.errs.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED, "leadership transfer: "+err.Error())
		}
		leader := s.cluster.Leader()
		return connect.NewResponse(&lockdv1.TransferLeadershipResponse{Leader: string(leader)}), nil
	})
}

// join adds a node on the leader, one membership change at a time: stale
// members with the same id or Raft address go first (a wiped node must never
// vote with its old identity), then the node is added as a non-voter, and a
// background task promotes it to voter once it has caught up.
func (s clusterAPI) join(ctx context.Context, m *lockdv1.JoinRequest) (*connect.Response[lockdv1.JoinResponse], error) {
	if m.NodeId == "" || len(m.NodeId) > 64 || m.RaftAddress == "" || m.ApiUrl == "" {
		return nil, s.errs.Invalid("join needs node_id (at most 64 bytes), raft_address and api_url")
	}
	if s.node.PromotedTerm() == 0 {
		return nil, s.errs.RaftError(raft.ErrNotLeader)
	}
	if err := s.versions.CheckJoinVersion(m.ApplyVersion); err != nil {
		return nil, s.errs.RaftError(err)
	}
	unlock := s.node.LockMembership()
	defer unlock()
	conf, err := s.cluster.Configuration()
	if err != nil {
		return nil, s.errs.RaftError(err)
	}
	id, addr := raft.ServerID(m.NodeId), raft.ServerAddress(m.RaftAddress)
	// A Join only ever comes from a node with an empty data dir (a node with
	// state ignores --join), so a member with the same id or address is a
	// previous life of it: remove it, even with an unchanged id and address,
	// so an empty node never votes as a voter the cluster counted on.
	for _, srv := range conf.Servers {
		switch {
		case srv.ID == id || srv.Address == addr:
			if srv.ID == raft.ServerID(s.nodeID) {
				return nil, s.errs.Invalid("node %s at %s is the leader itself", srv.ID, srv.Address)
			}
			s.log.Warn("removing stale member before join", "old_id", srv.ID, "old_raft", srv.Address, "new_id", id, "new_raft", addr)
			if err := s.cluster.RemoveServer(srv.ID, s.cfg.ApplyTimeout); err != nil {
				return nil, s.errs.RaftError(err)
			}
			if _, err := s.node.Propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: string(srv.ID), Remove: true}); err != nil {
				return nil, s.errs.RaftError(err)
			}
		}
	}
	if err := s.cluster.AddNonvoter(id, addr, s.cfg.ApplyTimeout); err != nil {
		return nil, s.errs.RaftError(err)
	}
	s.log.Info("member added as non-voter", "id", id, "raft", addr, "api", m.ApiUrl)
	if _, err := s.node.Propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: m.NodeId, ApiUrl: m.ApiUrl, RaftAddress: m.RaftAddress, NonVoter: m.NonVoter}); err != nil {
		return nil, s.errs.RaftError(err)
	}
	if !m.NonVoter {
		s.node.Background(func() { s.node.PromoteWhenCaughtUp(id, addr, m.ApiUrl) })
	}
	return connect.NewResponse(&lockdv1.JoinResponse{ClusterId: s.fsm.ClusterID(), Members: s.node.Members()}), nil
}

func (s clusterAPI) removeMember(id string) error {
	if id == "" {
		return s.errs.Invalid("node_id is required")
	}
	if s.node.PromotedTerm() == 0 {
		return s.errs.RaftError(raft.ErrNotLeader)
	}
	unlock := s.node.LockMembership()
	defer unlock()
	if id == s.nodeID {
		// Hand leadership over first; the new leader removes this node.
		return s.errs.Invalid("node %s is the leader: transfer leadership first (lockd leader transfer), then remove it", id)
	}
	if err := s.cluster.RemoveServer(raft.ServerID(id), s.cfg.ApplyTimeout); err != nil {
		return s.errs.RaftError(err)
	}
	if _, err := s.node.Propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: id, Remove: true}); err != nil {
		return s.errs.RaftError(err)
	}
	s.log.Info("member removed", "id", id)
	return nil
}
