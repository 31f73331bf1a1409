package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/retry"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// clusterAPI implements lockdv1connect.ClusterServiceHandler.
type clusterAPI struct{ s *Server }

var _ lockdv1connect.ClusterServiceHandler = (*clusterAPI)(nil)

func viaLeaderCluster[Req, Res any](ctx context.Context, c *clusterAPI, req *connect.Request[Req],
	call func(lockdv1connect.ClusterServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
	local func() (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	url, err := c.s.leaderURL(req.Header())
	if err != nil {
		return nil, err
	}
	if url == "" {
		return local()
	}
	return forward(ctx, c.s, url, c.s.fwd.clusterClient(url), req, call)
}

// Join adds a node to the cluster (on the leader, forwarded from a follower).
func (c *clusterAPI) Join(ctx context.Context, req *connect.Request[lockdv1.JoinRequest]) (*connect.Response[lockdv1.JoinResponse], error) {
	return viaLeaderCluster(ctx, c, req, lockdv1connect.ClusterServiceClient.Join, func() (*connect.Response[lockdv1.JoinResponse], error) {
		return c.s.join(ctx, req.Msg)
	})
}

// RemoveMember removes a member from the Raft configuration.
func (c *clusterAPI) RemoveMember(ctx context.Context, req *connect.Request[lockdv1.RemoveMemberRequest]) (*connect.Response[lockdv1.RemoveMemberResponse], error) {
	return viaLeaderCluster(ctx, c, req, lockdv1connect.ClusterServiceClient.RemoveMember, func() (*connect.Response[lockdv1.RemoveMemberResponse], error) {
		if err := c.s.removeMember(req.Msg.NodeId); err != nil {
			return nil, err
		}
		return connect.NewResponse(&lockdv1.RemoveMemberResponse{}), nil
	})
}

// TransferLeadership hands leadership to a voter (one given, or any).
func (c *clusterAPI) TransferLeadership(ctx context.Context, req *connect.Request[lockdv1.TransferLeadershipRequest]) (*connect.Response[lockdv1.TransferLeadershipResponse], error) {
	return viaLeaderCluster(ctx, c, req, lockdv1connect.ClusterServiceClient.TransferLeadership, func() (*connect.Response[lockdv1.TransferLeadershipResponse], error) {
		s := c.s
		var f raft.Future
		if id := req.Msg.NodeId; id != "" {
			addr, ok := s.voterAddress(id)
			if !ok {
				return nil, s.invalid("node %q is not a voter of this cluster", id)
			}
			f = s.raft.LeadershipTransferToServer(raft.ServerID(id), addr)
		} else {
			f = s.raft.LeadershipTransfer()
		}
		if err := f.Error(); err != nil {
			return nil, s.apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED, "leadership transfer: "+err.Error())
		}
		_, leader := s.raft.LeaderWithID()
		return connect.NewResponse(&lockdv1.TransferLeadershipResponse{Leader: string(leader)}), nil
	})
}

func (s *Server) voterAddress(id string) (raft.ServerAddress, bool) {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return "", false
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == id && srv.Suffrage == raft.Voter {
			return srv.Address, true
		}
	}
	return "", false
}

// join adds a node on the leader, one membership change at a time: stale
// members with the same id or Raft address go first (a wiped node must never
// vote with its old identity), then the node is added as a non-voter, and a
// background task promotes it to voter once it has caught up.
func (s *Server) join(ctx context.Context, m *lockdv1.JoinRequest) (*connect.Response[lockdv1.JoinResponse], error) {
	if m.NodeId == "" || len(m.NodeId) > 64 || m.RaftAddress == "" || m.ApiUrl == "" {
		return nil, s.invalid("join needs node_id (at most 64 bytes), raft_address and api_url")
	}
	if s.promotedTerm.Load() == 0 {
		return nil, s.raftError(raft.ErrNotLeader)
	}
	s.membershipMu.Lock()
	defer s.membershipMu.Unlock()
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, s.raftError(err)
	}
	id, addr := raft.ServerID(m.NodeId), raft.ServerAddress(m.RaftAddress)
	// A Join only ever comes from a node with an empty data dir (a node with
	// state ignores --join), so a member with the same id or address is a
	// previous life of it: remove it, even with an unchanged id and address,
	// so an empty node never votes as a voter the cluster counted on.
	for _, srv := range f.Configuration().Servers {
		switch {
		case srv.ID == id || srv.Address == addr:
			if srv.ID == raft.ServerID(s.nodeID) {
				return nil, s.invalid("node %s at %s is the leader itself", srv.ID, srv.Address)
			}
			s.log.Warn("removing stale member before join", "old_id", srv.ID, "old_raft", srv.Address, "new_id", id, "new_raft", addr)
			if err := s.raft.RemoveServer(srv.ID, 0, s.cfg.ApplyTimeout).Error(); err != nil {
				return nil, s.raftError(err)
			}
			if _, err := s.propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: string(srv.ID), Remove: true}); err != nil {
				return nil, s.raftError(err)
			}
		}
	}
	if err := s.raft.AddNonvoter(id, addr, 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return nil, s.raftError(err)
	}
	s.log.Info("member added as non-voter", "id", id, "raft", addr, "api", m.ApiUrl)
	if _, err := s.propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: m.NodeId, ApiUrl: m.ApiUrl, RaftAddress: m.RaftAddress, NonVoter: m.NonVoter}); err != nil {
		return nil, s.raftError(err)
	}
	if !m.NonVoter {
		s.background(func() { s.promoteWhenCaughtUp(id, addr, m.ApiUrl) })
	}
	return connect.NewResponse(&lockdv1.JoinResponse{ClusterId: s.fsm.ClusterID(), Members: s.members()}), nil
}

// promotePending resumes the promotion of every member that joined as a
// voter but is still a non-voter: the leader that added it may have lost
// leadership before promoting it, and nobody else would.
func (s *Server) promotePending() {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	for _, srv := range f.Configuration().Servers {
		m, ok := s.fsm.Member(string(srv.ID))
		if srv.Suffrage != raft.Nonvoter || !ok || m.NonVoter || m.API == "" {
			continue
		}
		s.log.Info("resuming promotion of member", "id", srv.ID)
		s.background(func() { s.promoteWhenCaughtUp(srv.ID, srv.Address, m.API) })
	}
}

// promoteSchedule paces promoteWhenCaughtUp's polls of a new member.
var promoteSchedule = retry.Backoff{Base: 100 * time.Millisecond, Cap: 2 * time.Second}

// promoteWhenCaughtUp polls the new member's Status until it has applied
// the leader's commit index as of now, then makes it a voter. It gives up
// after ten minutes, leaving the member a non-voter (logged).
func (s *Server) promoteWhenCaughtUp(id raft.ServerID, addr raft.ServerAddress, api string) {
	target := s.raft.CommitIndex()
	c := s.fwd.lockClient(api)
	ctx, cancel := s.untilClosed()
	defer cancel()
	r := retry.New(ctx, promoteSchedule).GiveUpAfter(10 * time.Minute)
	defer r.Stop()
	for r.Next() {
		actx, acancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
		resp, err := c.Status(actx, connect.NewRequest(&lockdv1.StatusRequest{}))
		acancel()
		if err == nil && resp.Msg.AppliedIndex < target {
			err = fmt.Errorf("member %s applied %d of %d", id, resp.Msg.AppliedIndex, target)
		}
		if err != nil {
			r.Fail(err)
			continue
		}
		done, err := s.promote(id, addr)
		if done {
			return
		}
		s.log.Warn("promote member failed", "id", id, "err", err)
		if errors.Is(err, raft.ErrNotLeader) {
			return
		}
		r.Fail(err)
	}
	if ctx.Err() == nil {
		s.log.Error("member did not catch up; left as non-voter", "id", id)
	}
}

// promote makes the non-voter id at addr a voter; done when it did, or
// when the member is no longer a non-voter waiting for it.
func (s *Server) promote(id raft.ServerID, addr raft.ServerAddress) (done bool, err error) {
	s.membershipMu.Lock()
	defer s.membershipMu.Unlock()
	// Promote only the member as it still is: an operator may have removed
	// it meanwhile, and AddVoter would add it back.
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return false, err
	}
	if !slices.ContainsFunc(f.Configuration().Servers, func(srv raft.Server) bool {
		return srv.ID == id && srv.Address == addr && srv.Suffrage == raft.Nonvoter
	}) {
		s.log.Info("member no longer waits for promotion", "id", id)
		return true, nil
	}
	if err := s.raft.AddVoter(id, addr, f.Index(), s.cfg.ApplyTimeout).Error(); err != nil {
		return false, err
	}
	s.log.Info("member promoted to voter", "id", id)
	return true, nil
}

func (s *Server) removeMember(id string) error {
	if id == "" {
		return s.invalid("node_id is required")
	}
	if s.promotedTerm.Load() == 0 {
		return s.raftError(raft.ErrNotLeader)
	}
	s.membershipMu.Lock()
	defer s.membershipMu.Unlock()
	if id == s.nodeID {
		// Hand leadership over first; the new leader removes this node.
		return s.invalid("node %s is the leader: transfer leadership first (lockd leader transfer), then remove it", id)
	}
	if err := s.raft.RemoveServer(raft.ServerID(id), 0, s.cfg.ApplyTimeout).Error(); err != nil {
		return s.raftError(err)
	}
	if _, err := s.propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: id, Remove: true}); err != nil {
		return s.raftError(err)
	}
	s.log.Info("member removed", "id", id)
	return nil
}

// members lists the Raft configuration with each member's recorded API URL
// and its role as this node sees it.
func (s *Server) members() []*lockdv1.Member {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	_, leader := s.raft.LeaderWithID()
	var out []*lockdv1.Member
	for _, srv := range f.Configuration().Servers {
		role := "follower"
		switch {
		case srv.ID == leader:
			role = "leader"
		case string(srv.ID) == s.nodeID:
			role = strings.ToLower(s.raft.State().String())
		}
		m, _ := s.fsm.Member(string(srv.ID))
		api := m.API
		if string(srv.ID) == s.nodeID {
			api = s.apiURL
		}
		out = append(out, &lockdv1.Member{Id: string(srv.ID), Api: api, Raft: string(srv.Address), Role: role, Voter: srv.Suffrage == raft.Voter})
	}
	return out
}

// joinSchedule is the wait between rounds of Join attempts.
var joinSchedule = retry.Backoff{Base: 100 * time.Millisecond, Cap: 3 * time.Second}

// joinCluster asks the members at urls to add this node, retrying with
// backoff and full jitter until one accepts or ctx ends. It runs before
// this node opens its Raft port.
func (s *Server) joinCluster(ctx context.Context, urls []string, raftAddr string) error {
	req := &lockdv1.JoinRequest{NodeId: s.nodeID, RaftAddress: raftAddr, ApiUrl: s.apiURL}
	self, _ := endpoint.Normalize(s.apiURL)
	r := retry.New(ctx, joinSchedule)
	for r.Next() {
		for _, raw := range urls {
			u, err := endpoint.NormalizeScheme(raw, s.scheme())
			if err != nil {
				return fmt.Errorf("join via %q: %w", raw, err)
			}
			if u == self {
				continue // this node serves nothing until it has joined
			}
			actx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
			resp, err := s.fwd.clusterClient(u).Join(actx, connect.NewRequest(req))
			cancel()
			if err == nil {
				s.log.Info("joined cluster", "via", u, "cluster_id", resp.Msg.ClusterId)
				return nil
			}
			r.Fail(fmt.Errorf("join via %s: %w", u, err))
			switch connect.CodeOf(err) {
			case connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodePermissionDenied:
				// Refused (a bad request, no peer token, or not a cluster
				// member's certificate): asking again changes nothing.
				return r.Last()
			}
		}
	}
	return r.Err()
}
