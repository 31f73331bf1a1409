// Package api is the API layer's view of a node: the interface the Connect
// handlers, the session stream, the watch and forwarding are written
// against (this package), which *node.Node satisfies. It sits on
// the consumer's side, Go style, so the node never imports the API layer
// and a handler can reach nothing of the node beyond these methods and the
// FSM's read views (node.Parts). See DESIGN.md in this folder.
package api

import (
	"crypto/tls"
	"crypto/x509"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Node is what the API layer calls on a node.
type Node interface {
	// Propose appends a command to the Raft log and returns Apply's result
	// once it is committed and applied on this node.
	Propose(t fsm.CmdType, m proto.Message) (*fsm.Result, error)
	// Linearizable returns nil when a read of the FSM on this node now is
	// linearizable (this node leads, its leadership verified after the call).
	Linearizable() error
	// Ready reports whether this node is the established leader.
	Ready() bool
	// PromotedTerm is the term whose lease timers run here, 0 when none.
	PromotedTerm() uint64
	// LeadershipChanges is closed at the next leadership change of this node.
	LeadershipChanges() <-chan struct{}
	// HeardLeader is the leader's id as this node knows it, "" when none.
	HeardLeader() raft.ServerID
	// Background runs f in a goroutine the node waits for on close, unless
	// it is closing (then false).
	Background(f func()) bool

	// Members lists the cluster's members.
	Members() []*lockdv1.Member
	// VoterAddress is the Raft address of voter id.
	VoterAddress(id string) (raft.ServerAddress, bool)
	// PromoteWhenCaughtUp makes a joined non-voter a voter once it has
	// caught up (run it with Background).
	PromoteWhenCaughtUp(id raft.ServerID, addr raft.ServerAddress, api string)
	// LockMembership orders membership changes; call the returned unlock.
	LockMembership() (unlock func())
	// VerifyPeer checks that cs carries a cluster member's certificate.
	VerifyPeer(cs *tls.ConnectionState) (*x509.Certificate, error)
}

// *node.Node is the one implementation.
var _ Node = (*node.Node)(nil)

// Cluster is what the API layer reads and asks of Raft itself, beside
// Node: Status's figures, leadership transfer, and the membership changes
// of a join or a removal. node.RaftView is the one implementation.
type Cluster interface {
	// State is this node's Raft state.
	State() raft.RaftState
	// Leader is the leader's id as Raft knows it, "" when none.
	Leader() raft.ServerID
	// Term is Raft's current term.
	Term() uint64
	// CommitIndex is the index of the last entry known committed.
	CommitIndex() uint64
	// AppliedIndex is the index of the last entry applied here.
	AppliedIndex() uint64
	// TransferLeadership hands leadership to voter id at addr (any voter
	// when id is "") and returns when the transfer ends.
	TransferLeadership(id raft.ServerID, addr raft.ServerAddress) error
	// Configuration is Raft's latest membership configuration.
	Configuration() (raft.Configuration, error)
	// RemoveServer removes a member from the configuration.
	RemoveServer(id raft.ServerID, timeout time.Duration) error
	// AddNonvoter adds a member that receives the log but does not vote.
	AddNonvoter(id raft.ServerID, addr raft.ServerAddress, timeout time.Duration) error
}

// node.RaftView is the one implementation.
var _ Cluster = node.RaftView{}
