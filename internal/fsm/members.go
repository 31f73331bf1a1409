package fsm

import (
	"slices"
	"strings"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Member is what the FSM records of a node: its API URL (for forwarding and
// for clients learning the cluster) and its Raft address. Raft membership
// itself lives in Raft's configuration, not here.
type Member struct {
	// ID is the node id.
	ID string
	// API is the node's API URL.
	API string
	// Raft is the node's Raft address.
	Raft string
	// NonVoter is set for a node that joined as a non-voter on request: no
	// leader promotes it. Any other member that is still a non-voter is
	// promoted by the leader once it has caught up.
	NonVoter bool
}

func (f *FSM) applySetMember(c *fsmv1.SetMember) *Result {
	if c.NodeId == "" || len(c.NodeId) > 64 || len(c.ApiUrl) > 512 || len(c.RaftAddress) > 512 {
		return fail(CodeInvalid, "bad member")
	}
	if c.Remove {
		delete(f.members, c.NodeId)
		return &Result{}
	}
	if _, ok := f.members[c.NodeId]; !ok && len(f.members) >= limits.members {
		return fail(CodeTooMany, "%d members recorded already", limits.members)
	}
	f.members[c.NodeId] = Member{ID: c.NodeId, API: c.ApiUrl, Raft: c.RaftAddress, NonVoter: c.NonVoter}
	return &Result{}
}

// Member returns the recorded addresses of node id.
func (f *FSM) Member(id string) (Member, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.members[id]
	return m, ok
}

// Members returns every recorded member, by id.
func (f *FSM) Members() []Member {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]Member, 0, len(f.members))
	for _, m := range f.members {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}
