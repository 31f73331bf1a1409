// Package api is the API layer's view of a node: the interface the Connect
// handlers, the session stream, the watch and forwarding are written
// against (internal/server today), which *node.Node satisfies. It sits on
// the consumer's side, Go style, so the node never imports the API layer
// and a handler can reach nothing of the node beyond these methods and the
// FSM's read views (node.Parts). See DESIGN.md in this folder.
package api

import (
	"crypto/tls"
	"crypto/x509"

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
