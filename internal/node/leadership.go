package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/retry"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// This file follows leadership: establishing it (Barrier, Init or Restore,
// the leader's timers), losing it, the timers' callbacks, linearizable reads
// and handing leadership over on shutdown.

// leadership follows this node's leadership: establishing it, losing it,
// and handing it over on shutdown.
type leadership struct{ *Node }

// Ready reports whether this node is the established leader: the leader of
// an initialized cluster with its lease timers running.
func (s *Node) Ready() bool {
	return s.promotedTerm.Load() != 0 && s.fsm.ClusterID() != ""
}

// Propose appends a command to the Raft log and returns the FSM's result
// once it is committed and applied here.
func (s *Node) Propose(t fsm.CmdType, m proto.Message) (*fsm.Result, error) {
	if err := (versionGate{s}).check(t, m); err != nil {
		return nil, err
	}
	b, err := fsm.Encode(t, m)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	end := s.watch.begin()
	defer end()
	var f raft.ApplyFuture
	if err := s.raftCall(func() error {
		f = s.raft.Apply(b, s.cfg.ApplyTimeout)
		return f.Error()
	}); err != nil {
		return nil, err
	}
	s.metrics.applyDuration.Observe(time.Since(start).Seconds())
	r, ok := f.Response().(*fsm.Result)
	if !ok {
		return nil, fmt.Errorf("unexpected apply response %T", f.Response())
	}
	return r, nil
}

// raftCall runs f, a call that waits for a Raft future, unless Close has
// begun to shut Raft down. hashicorp/raft never answers a future still
// queued on its channels when it shuts down, so a call made just before
// would block its goroutine forever: Close waits for the calls in flight
// (each ends, answered or with leadership lost) before it shuts Raft down,
// and none starts after.
func (s *Node) raftCall(f func() error) error {
	s.raftMu.RLock()
	defer s.raftMu.RUnlock()
	if s.raftClosed {
		return raft.ErrRaftShutdown
	}
	return f()
}

// Background runs f in a goroutine Close waits for, unless Close has begun.
func (s *Node) Background(f func()) bool {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// watchLeadership follows Raft's leadership notifications: a new leader runs
// a Barrier, initializes a new cluster, then starts every session's lease
// timer in full; losing leadership stops every timer at once.
func (s leadership) watchLeadership(notify <-chan bool) {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case isLeader := <-notify:
			s.leaderMu.Lock()
			s.leaderGen++
			gen := s.leaderGen
			close(s.leaderChanged)
			s.leaderChanged = make(chan struct{})
			s.promotedTerm.Store(0)
			leaderTimers(s).demoteTimers()
			s.leaderMu.Unlock()
			if isLeader {
				s.Background(func() { s.establish(gen) })
			} else {
				s.log.Info("leadership lost")
			}
		}
	}
}

// establish makes this node's leadership of generation gen usable: a
// barrier (every earlier entry applied), the cluster's first entries when
// it has none, this node's member record, then the leader's timers. A
// failed step is retried, about once per election timeout (jittered),
// while this node leads and the server runs.
func (s leadership) establish(gen uint64) {
	ctx, cancel := s.untilClosed()
	defer cancel()
	r := retry.New(ctx, retry.Backoff{Base: s.cfg.ElectionTimeout, Cap: s.cfg.ElectionTimeout})
	for r.Next() {
		if s.raft.State() != raft.Leader {
			return
		}
		err := s.tryEstablish(gen)
		if err == nil || errors.Is(err, errFatalRestore) {
			return
		}
		s.log.Warn("leader barrier failed", "err", err, "attempt", r.Attempt())
		r.Fail(err)
	}
}

// errFatalRestore: Apply refused the backup to restore from; every retry
// would too, and the server is stopping (s.fatal).
var errFatalRestore = errors.New("restore refused")

// tryEstablish is one attempt of establish: nil when done (or when the
// leadership it was for has already passed).
func (s leadership) tryEstablish(gen uint64) error {
	term := s.raft.CurrentTerm()
	end := s.watch.begin() // a hung disk stalls the Barrier too
	err := s.raftCall(func() error { return s.raft.Barrier(s.cfg.ApplyTimeout).Error() })
	end()
	if err == nil && s.fsm.ClusterID() == "" && s.restore != nil {
		var r *fsm.Result
		r, err = s.Propose(fsm.CmdRestore, &fsmv1.Restore{Snapshot: s.restore, ClusterId: RandomID(16), Epoch: uint64(wallclock.Now().UnixMicro())})
		if err == nil && r.Code != fsm.OK {
			s.fatal(fmt.Errorf("restore from backup %s: %w", s.cfg.Restore, r.Err()))
			return errFatalRestore
		}
		if err == nil {
			s.log.Info("cluster restored from backup", "file", s.cfg.Restore, "cluster_id", s.fsm.ClusterID(), "epoch", s.fsm.Info().Epoch)
		}
	}
	if err == nil && s.fsm.ClusterID() == "" {
		_, err = s.Propose(fsm.CmdInit, &fsmv1.Init{
			ClusterId:    RandomID(16),
			Epoch:        uint64(wallclock.Now().UnixMicro()),
			TimeUnixNano: wallclock.Now().UnixNano(),
		})
	}
	if err == nil {
		err = s.recordSelf()
	}
	if err != nil {
		return err
	}
	var changed <-chan struct{} // closed when this leadership ends
	s.leaderMu.Lock()
	established := s.leaderGen == gen && s.raft.State() == raft.Leader && s.raft.CurrentTerm() == term
	if established {
		leaderTimers(s).promoteTimers(term)
		probed := make(chan struct{})
		s.vers.probed.Store(&probed)
		s.promotedTerm.Store(term)
		s.firstReadyOnce.Do(func() { close(s.firstReady) })
		changed = s.leaderChanged
		s.log.Info("leadership established", "term", term, "sessions", s.fsm.Info().Sessions)
	}
	s.leaderMu.Unlock()
	if established {
		s.Background(Membership(s).promotePending)
		s.Background(func() { versionGate(s).probeVersions(changed) })
	}
	return nil
}

// untilClosed returns a context cancelled when the server closes (or by
// the returned cancel), for the retry loops of background work.
func (s *Node) untilClosed() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// LeadershipChanges returns a channel closed at the next leadership change
// of this node (gained or lost).
func (s *Node) LeadershipChanges() <-chan struct{} {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	return s.leaderChanged
}

// Linearizable makes a read on this node linearizable: this node must be the
// leader of a term whose Barrier has finished (so every entry an earlier
// leader acknowledged is applied here), still leader after the request was
// received (VerifyLeader, started after this call), and in the same term. Every write acknowledged
// before the read began is then applied in the FSM.
func (s *Node) Linearizable() error {
	term := s.promotedTerm.Load()
	if term == 0 {
		return raft.ErrNotLeader
	}
	// One VerifyLeader serves every request that arrived before it started
	// (verify.go): under load, one round of heartbeats per batch of
	// requests instead of one per request.
	err := s.verify.Do(func() error {
		checkTerm := s.raft.CurrentTerm()
		since := time.Now()
		end := s.watch.begin() // VerifyLeader runs on the leader loop a hung disk blocks
		err := s.raftCall(func() error { return s.raft.VerifyLeader().Error() })
		end()
		if err != nil {
			return err
		}
		// VerifyLeader also counts replies to requests sent before it
		// began (acks.go): require a quorum of replies to requests of this
		// term sent since.
		return s.freshQuorum(checkTerm, since)
	})
	if err != nil {
		return err
	}
	if s.raft.CurrentTerm() != term || s.promotedTerm.Load() != term {
		return raft.ErrLeadershipLost
	}
	return nil
}

// transferOnShutdown hands leadership to another voter before this leader
// stops, so clients see a leader change instead of an election timeout. The
// target is a voter that answers a Status call now, the one that applied
// most: a transfer to a stopped or cut-off voter fails anyway, and leaves
// Raft's TimeoutNow RPC to it running after Close returns (hashicorp/raft's
// Shutdown does not wait for the transfer's goroutines).
func (s leadership) transferOnShutdown() {
	if s.raft.State() != raft.Leader {
		return
	}
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		target  *raft.Server
		applied uint64
	)
	for _, srv := range f.Configuration().Servers {
		m, ok := s.fsm.Member(string(srv.ID))
		if srv.Suffrage != raft.Voter || string(srv.ID) == s.nodeID || !ok || m.API == "" {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ElectionTimeout)
			defer cancel()
			resp, err := s.fwd.LockClient(m.API).Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
			if err != nil || resp.Msg.NodeId != string(srv.ID) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if target == nil || resp.Msg.AppliedIndex > applied {
				target, applied = &srv, resp.Msg.AppliedIndex
			}
		})
	}
	wg.Wait()
	if target == nil {
		s.log.Info("no voter answers: stopping without a leadership transfer")
		return
	}
	if err := s.raft.LeadershipTransferToServer(target.ID, target.Address).Error(); err != nil {
		s.log.Warn("leadership transfer on shutdown failed", "to", target.ID, "err", err)
		return
	}
	s.log.Info("leadership transferred on shutdown", "to", target.ID)
}

// recordSelf makes sure the FSM knows this leader's API URL, so followers
// can forward to it.
func (s leadership) recordSelf() error {
	if m, ok := s.fsm.Member(s.nodeID); ok && m.API == s.apiURL && m.Raft == string(s.trans.LocalAddr()) {
		return nil
	}
	_, err := s.Propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: s.nodeID, ApiUrl: s.apiURL, RaftAddress: string(s.trans.LocalAddr())})
	return err
}
