package node

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// This file makes the leadership check of KeepAlives and linearizable reads
// count only replies to requests sent after the check began.
//
// hashicorp/raft's VerifyLeader registers its future with every follower's
// replication and succeeds once a quorum of replies said "still leader" —
// including replies to heartbeats and appends that were already in flight,
// sent before VerifyLeader was called. Such a reply says nothing of the
// follower after the request was received (it may have voted for a new
// leader since), so the lease rule would hold only while every reply arrives
// within about grace + heartbeat timeout, which nothing bounds (the Raft
// transport's timeout is 10 s). ackTransport notes, per peer, the send time
// and term of the newest AppendEntries request that a successful reply
// answered; after VerifyLeader the check also waits until a quorum of voters
// (this node counts) has answered a request of this term sent at or after
// the check began (docs/design.md, "Fresh replies only").

// ErrNoFreshQuorum: VerifyLeader succeeded, but no quorum of voters answered
// a request sent after the check began, within a heartbeat timeout. The
// node cannot show it still leads; clients try another node.
var ErrNoFreshQuorum = fmt.Errorf("no quorum of voters answered a heartbeat sent after the leadership check began: %w", raft.ErrNotLeader)

// ack is the newest AppendEntries request a peer answered with success.
type ack struct {
	term uint64
	sent time.Time // when the request was handed to the transport (monotonic)
}

// ackTracker records the acks of every peer and lets a leadership check
// wait for fresh ones. The zero value is ready to use.
type ackTracker struct {
	mu      sync.Mutex
	peers   map[raft.ServerID]ack
	changed chan struct{} // non-nil while a check waits; closed at the next ack

	// waits counts checks VerifyLeader confirmed before a fresh quorum had
	// answered (they waited for it); stale those where none did in time
	// (ErrNoFreshQuorum). For tests and benchmarks.
	waits, stale atomic.Uint64
}

// record notes that peer id answered, with success, a request of term sent
// at sent. It runs on every successful heartbeat and append: no allocation
// once the peer is known.
func (t *ackTracker) record(id raft.ServerID, term uint64, sent time.Time) {
	t.mu.Lock()
	if t.peers == nil {
		t.peers = make(map[raft.ServerID]ack)
	}
	if a, ok := t.peers[id]; !ok || term > a.term || term == a.term && sent.After(a.sent) {
		t.peers[id] = ack{term: term, sent: sent}
	}
	if t.changed != nil {
		close(t.changed)
		t.changed = nil
	}
	t.mu.Unlock()
}

// freshLocked reports whether a quorum of the voters among servers answered
// requests of term sent at or after since; self counts as answered.
func (t *ackTracker) freshLocked(self raft.ServerID, servers []raft.Server, term uint64, since time.Time) bool {
	voters, answered := 0, 0
	for _, s := range servers {
		if s.Suffrage != raft.Voter {
			continue // hashicorp/raft's VerifyLeader counts non-voters too; we don't
		}
		voters++
		if s.ID == self {
			answered++
			continue
		}
		if a, ok := t.peers[s.ID]; ok && a.term == term && !a.sent.Before(since) {
			answered++
		}
	}
	return voters > 0 && answered > voters/2
}

// await returns nil once a quorum of the voters among servers (self
// included) has answered requests of term sent at or after since. It waits
// for the acks the transport records (no polling), for at most timeout,
// and ends early when stop or the channel lost returns is closed.
func (t *ackTracker) await(self raft.ServerID, servers []raft.Server, term uint64, since time.Time, timeout time.Duration, stop <-chan struct{}, lost func() <-chan struct{}) error {
	t.mu.Lock()
	if t.freshLocked(self, servers, term, since) {
		t.mu.Unlock()
		return nil
	}
	t.mu.Unlock()
	// Rare: VerifyLeader was answered by a reply to a request sent before
	// the check began. The heartbeats VerifyLeader triggered are on their
	// way; wait for their replies.
	t.waits.Add(1)
	leadership := lost()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		t.mu.Lock()
		if t.freshLocked(self, servers, term, since) {
			t.mu.Unlock()
			return nil
		}
		if t.changed == nil {
			t.changed = make(chan struct{})
		}
		changed := t.changed
		t.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			t.stale.Add(1)
			return ErrNoFreshQuorum
		case <-leadership:
			return raft.ErrLeadershipLost
		case <-stop:
			return raft.ErrRaftShutdown
		}
	}
}

// ackTransport is the Raft transport as the server hands it to Raft: the
// wrapped transport, with every successful AppendEntries reply recorded in
// acks. Heartbeats and the appends hashicorp/raft sends outside a pipeline
// are recorded; pipelined appends and InstallSnapshot are passed on
// untouched (their replies prove nothing fresh to the check, which then
// waits for the heartbeat VerifyLeader triggered).
type ackTransport struct {
	raft.Transport
	acks *ackTracker
}

// ackPreVoteTransport is an ackTransport over a transport that supports
// pre-vote: hashicorp/raft decides to pre-vote by a type assertion, so the
// wrapper has that method only when the wrapped transport does.
type ackPreVoteTransport struct {
	*ackTransport
	pv raft.WithPreVote
}

// trackAcks wraps t so that acks sees its AppendEntries replies. The
// wrapper keeps t's optional behaviour: pre-vote (raft.WithPreVote) exactly
// when t has it; Close, CloseStreams and raft.WithPeers are passed on when
// t has them and do nothing otherwise. Another optional method that Raft
// or the server looks for on the transport must be passed on here too.
func trackAcks(t raft.Transport, acks *ackTracker) raft.Transport {
	at := &ackTransport{Transport: t, acks: acks}
	if pv, ok := t.(raft.WithPreVote); ok {
		return &ackPreVoteTransport{ackTransport: at, pv: pv}
	}
	return at
}

// AppendEntries sends the request and records a successful reply with the
// time the request was sent.
func (t *ackTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	sent := time.Now()
	err := t.Transport.AppendEntries(id, target, args, resp)
	if err == nil && resp.Success && resp.Term == args.Term {
		t.acks.record(id, args.Term, sent)
	}
	return err
}

// Close closes the wrapped transport if it can be closed (raft.WithClose).
func (t *ackTransport) Close() error {
	if c, ok := t.Transport.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// CloseStreams passes on to NetworkTransport.CloseStreams (see Close in
// server.go).
func (t *ackTransport) CloseStreams() {
	if c, ok := t.Transport.(interface{ CloseStreams() }); ok {
		c.CloseStreams()
	}
}

// Connect passes on to raft.WithPeers (in-memory transports in tests).
func (t *ackTransport) Connect(peer raft.ServerAddress, tr raft.Transport) {
	if p, ok := t.Transport.(raft.WithPeers); ok {
		p.Connect(peer, tr)
	}
}

// Disconnect passes on to raft.WithPeers.
func (t *ackTransport) Disconnect(peer raft.ServerAddress) {
	if p, ok := t.Transport.(raft.WithPeers); ok {
		p.Disconnect(peer)
	}
}

// DisconnectAll passes on to raft.WithPeers.
func (t *ackTransport) DisconnectAll() {
	if p, ok := t.Transport.(raft.WithPeers); ok {
		p.DisconnectAll()
	}
}

// RequestPreVote passes on to the wrapped transport's pre-vote.
func (t *ackPreVoteTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return t.pv.RequestPreVote(id, target, args, resp)
}

// freshQuorum is the second half of a leadership check that began at since
// in term (after VerifyLeader succeeded): a quorum of voters must have
// answered requests of term sent at or after since.
func (s *Node) freshQuorum(term uint64, since time.Time) error {
	f := s.raft.GetConfiguration() // a copy Raft keeps; no round trip to its loop
	if err := f.Error(); err != nil {
		return err
	}
	err := s.acks.await(raft.ServerID(s.nodeID), f.Configuration().Servers, term, since, s.cfg.HeartbeatTimeout, s.done, s.LeadershipChanges)
	if errors.Is(err, ErrNoFreshQuorum) {
		s.log.Warn("leadership check: VerifyLeader was answered, but not by replies to heartbeats sent after it began", "term", term, "waited", s.cfg.HeartbeatTimeout)
	}
	return err
}
