package node

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
	"github.com/lockd-dev/lockd/internal/retry"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Membership changes and lists the cluster's members: the Raft
// configuration and the members' records in the FSM.
type Membership struct{ *Node }

// VoterAddress returns the Raft address of voter id, false when id is not a voter.
func (s *Node) VoterAddress(id string) (raft.ServerAddress, bool) {
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

// promotePending resumes the promotion of every member that joined as a
// voter but is still a non-voter: the leader that added it may have lost
// leadership before promoting it, and nobody else would.
func (s Membership) promotePending() {
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
		s.Background(func() { s.PromoteWhenCaughtUp(srv.ID, srv.Address, m.API) })
	}
}

// PromoteWhenCaughtUp polls the new member's Status until it has applied
// the leader's commit index as of now, then makes it a voter. It gives up
// after ten minutes, leaving the member a non-voter (logged).
func (s *Node) PromoteWhenCaughtUp(id raft.ServerID, addr raft.ServerAddress, api string) {
	target := s.raft.CommitIndex()
	c := s.fwd.LockClient(api)
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
		done, err := Membership{s}.promote(id, addr)
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
func (s Membership) promote(id raft.ServerID, addr raft.ServerAddress) (done bool, err error) {
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

// Members lists the Raft configuration with each member's recorded API URL
// and its role as this node sees it.
func (s *Node) Members() []*lockdv1.Member {
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
func (s Membership) joinCluster(ctx context.Context, urls []string, raftAddr string) error {
	req := &lockdv1.JoinRequest{NodeId: s.nodeID, RaftAddress: raftAddr, ApiUrl: s.apiURL, ApplyVersion: Versions(s).ApplyVersion()}
	self, _ := endpoint.Normalize(s.apiURL)
	r := retry.New(ctx, joinSchedule)
	for r.Next() {
		for _, raw := range urls {
			u, err := endpoint.NormalizeScheme(raw, Peers(s).Scheme())
			if err != nil {
				return fmt.Errorf("join via %q: %w", raw, err)
			}
			if u == self {
				continue // this node serves nothing until it has joined
			}
			actx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
			resp, err := s.fwd.ClusterClient(u).Join(actx, connect.NewRequest(req))
			cancel()
			if err == nil {
				s.log.Info("joined cluster", "via", u, "cluster_id", resp.Msg.ClusterId)
				return nil
			}
			r.Fail(fmt.Errorf("join via %s: %w", u, err))
			switch connect.CodeOf(err) {
			case connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeFailedPrecondition:
				// Refused (a bad request, no peer token, not a cluster
				// member's certificate, or a version below the cluster's):
				// asking again changes nothing.
				return r.Last()
			}
		}
	}
	return r.Err()
}

// promoteSchedule paces PromoteWhenCaughtUp's polls of a new member.
var promoteSchedule = retry.Backoff{Base: 100 * time.Millisecond, Cap: 2 * time.Second}

// LockMembership takes the lock that orders membership changes (one at a
// time) and returns its release.
func (s *Node) LockMembership() (unlock func()) {
	s.membershipMu.Lock()
	return s.membershipMu.Unlock
}
