package node

import (
	"time"

	"github.com/hashicorp/raft"
)

// RaftView is what the API layer reads and asks of Raft itself: its state,
// the leader, the indexes Status reports, leadership transfer and the
// membership changes of a join or a removal. It holds no state of its
// own; build it as RaftView{n} once the node has started.
type RaftView struct{ *Node }

// State is this node's Raft state.
func (v RaftView) State() raft.RaftState { return v.raft.State() }

// Leader is the leader's id as Raft knows it, "" when none.
func (v RaftView) Leader() raft.ServerID {
	_, id := v.raft.LeaderWithID()
	return id
}

// Term is Raft's current term.
func (v RaftView) Term() uint64 { return v.raft.CurrentTerm() }

// CommitIndex is the index of the last entry known committed.
func (v RaftView) CommitIndex() uint64 { return v.raft.CommitIndex() }

// AppliedIndex is the index of the last entry applied to the FSM.
func (v RaftView) AppliedIndex() uint64 { return v.raft.AppliedIndex() }

// TransferLeadership hands leadership to voter id at addr, or to any
// voter when id is "", and returns when the transfer ends.
func (v RaftView) TransferLeadership(id raft.ServerID, addr raft.ServerAddress) error {
	if id == "" {
		return v.raft.LeadershipTransfer().Error()
	}
	return v.raft.LeadershipTransferToServer(id, addr).Error()
}

// Configuration is Raft's latest membership configuration.
func (v RaftView) Configuration() (raft.Configuration, error) {
	f := v.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, err
	}
	return f.Configuration(), nil
}

// RemoveServer removes a member from the configuration.
func (v RaftView) RemoveServer(id raft.ServerID, timeout time.Duration) error {
	return v.raft.RemoveServer(id, 0, timeout).Error()
}

// AddNonvoter adds a member that receives the log but does not vote.
func (v RaftView) AddNonvoter(id raft.ServerID, addr raft.ServerAddress, timeout time.Duration) error {
	return v.raft.AddNonvoter(id, addr, 0, timeout).Error()
}
