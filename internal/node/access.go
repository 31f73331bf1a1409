package node

import (
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
)

// This file is what the API layer and the assembly read of a node.

// Parts are the pieces of a node the API layer reads or feeds, each built
// once by Open (Raft and Forwarder: by Start).
type Parts struct {
	FSM         *fsm.FSM         // the state machine: the API reads its views
	Raft        *raft.Raft       // set by Start
	Lease       *lease.Manager   // the sessions' lease timers (KeepAlive renews through it)
	Waiters     *Waiters         // the blocked Acquire calls
	Notices     *Notices         // the session streams that deliver release requests
	Hub         *Hub             // the watch history
	TLS         *certs.Store     // the node's certificates, nil without TLS
	ClientAuth  certs.ClientAuth // which client certificates the API asks for
	Done        <-chan struct{}  // closed when the node begins to stop
	LockMetrics *LockMetrics     // the lock and Raft metrics, which the API observes too
	Forwarder   *Forwarder       // clients to other members' APIs; set by Start
	Versions    Versions         // the version this node reports, the join check (version.go)
}

// Parts returns the node's parts (call it again after Start for Raft and
// Forwarder).
func (s *Node) Parts() Parts {
	return Parts{FSM: s.fsm, Raft: s.raft, Lease: s.lease, Waiters: s.waiters, Notices: s.notices, Hub: s.hub, TLS: s.tls,
		ClientAuth: s.clientAuth, Done: s.done, LockMetrics: s.metrics.lock, Forwarder: s.fwd, Versions: Versions{s}}
}

// ID returns this node's id.
func (s *Node) ID() string { return s.nodeID }

// RaftAddr returns the Raft transport's address (set by Start).
func (s *Node) RaftAddr() string { return string(s.trans.LocalAddr()) }

// PromotedTerm returns the term whose Barrier finished and whose lease
// timers run on this node, 0 while it is not the established leader.
func (s *Node) PromotedTerm() uint64 { return s.promotedTerm.Load() }

// Peers returns what the node knows of the other members (TLS, addresses).
func (s *Node) Peers() Peers { return Peers{s} }
