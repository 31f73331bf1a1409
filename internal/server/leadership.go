package server

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/retry"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// This file follows leadership: establishing it (Barrier, Init or Restore,
// the leader's timers), losing it, the timers' callbacks, linearizable reads
// and handing leadership over on shutdown.

// Ready reports whether this node is the established leader: the leader of
// an initialized cluster with its lease timers running.
func (s *Server) Ready() bool {
	return s.promotedTerm.Load() != 0 && s.fsm.ClusterID() != ""
}

// propose appends a command to the Raft log and returns the FSM's result
// once it is committed and applied here.
func (s *Server) propose(t fsm.CmdType, m proto.Message) (*fsm.Result, error) {
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
func (s *Server) raftCall(f func() error) error {
	s.raftMu.RLock()
	defer s.raftMu.RUnlock()
	if s.raftClosed {
		return raft.ErrRaftShutdown
	}
	return f()
}

// background runs f in a goroutine Close waits for, unless Close has begun.
func (s *Server) background(f func()) bool {
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
func (s *Server) watchLeadership(notify <-chan bool) {
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
			s.demoteTimers()
			s.leaderMu.Unlock()
			if isLeader {
				s.background(func() { s.establish(gen) })
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
func (s *Server) establish(gen uint64) {
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
func (s *Server) tryEstablish(gen uint64) error {
	term := s.raft.CurrentTerm()
	end := s.watch.begin() // a hung disk stalls the Barrier too
	err := s.raftCall(func() error { return s.raft.Barrier(s.cfg.ApplyTimeout).Error() })
	end()
	if err == nil && s.fsm.ClusterID() == "" && s.restore != nil {
		var r *fsm.Result
		r, err = s.propose(fsm.CmdRestore, &fsmv1.Restore{Snapshot: s.restore, ClusterId: randomID(16), Epoch: uint64(wallclock.Now().UnixMicro())})
		if err == nil && r.Code != fsm.OK {
			s.fatal(fmt.Errorf("restore from backup %s: %w", s.cfg.Restore, r.Err()))
			return errFatalRestore
		}
		if err == nil {
			s.log.Info("cluster restored from backup", "file", s.cfg.Restore, "cluster_id", s.fsm.ClusterID(), "epoch", s.fsm.Info().Epoch)
		}
	}
	if err == nil && s.fsm.ClusterID() == "" {
		_, err = s.propose(fsm.CmdInit, &fsmv1.Init{
			ClusterId:    randomID(16),
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
	s.leaderMu.Lock()
	established := s.leaderGen == gen && s.raft.State() == raft.Leader && s.raft.CurrentTerm() == term
	if established {
		s.promoteTimers(term)
		s.promotedTerm.Store(term)
		s.firstReadyOnce.Do(func() { close(s.firstReady) })
		s.log.Info("leadership established", "term", term, "sessions", s.fsm.Info().Sessions)
	}
	s.leaderMu.Unlock()
	if established {
		s.background(s.promotePending)
	}
	return nil
}

// untilClosed returns a context cancelled when the server closes (or by
// the returned cancel), for the retry loops of background work.
func (s *Server) untilClosed() (context.Context, context.CancelFunc) {
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

// promoteTimers starts the leader's timers of term in full: every
// session's lease, completion mark and lock-delay, each read under the FSM's
// lock so none is added or removed meanwhile.
func (s *Server) promoteTimers(term uint64) {
	var secretless []fsm.SessionInfo
	s.fsm.WithSessions(func(ss []fsm.SessionInfo) {
		promote(s.lease, term, len(ss), slices.All(ss), func(_ int, x fsm.SessionInfo) lease.Entry {
			// A session without a secret hash (restored from a backup
			// written before session secrets, or created by a node from
			// before them) accepts any secret in Apply: anyone who reads
			// its id could keep it alive and use its holds. No client of
			// this cluster knows a secret for it, so it is revoked as a
			// force-release revokes: no KeepAlive is accepted, and its
			// lease ends at its deadline in full (now + TTL + grace), by
			// the lease timer's own ExpireSession (holds released as an
			// expiry releases them: waiters granted, lock-delays kept). Not
			// at once: its holder may still be running under a lease an
			// earlier leader granted, and a lease never ends early across
			// a leader change. Apply is unchanged, so every version decides
			// the expiry alike.
			if x.Secretless {
				secretless = append(secretless, x)
			}
			return lease.Entry{ID: x.ID, TTL: x.TTL, Revoked: x.Revoked || x.Secretless}
		})
	})
	for _, x := range secretless {
		s.log.Warn("session without a secret revoked: it comes from a backup or node from before session secrets and would accept any secret; it accepts no keepalive and expires after its ttl and grace, its holds released as on expiry",
			"session", x.ID, "owner", x.Owner, "holds", x.Holds, "waits", x.Waits, "term", term)
	}
	s.fsm.WithMarks(func(ms map[string]fsm.Mark) {
		promote(s.marks, term, len(ms), maps.All(ms), func(name string, m fsm.Mark) lease.Entry {
			return lease.Entry{ID: markKey(name, m.Token), TTL: m.Retention}
		})
	})
	s.fsm.WithDelays(func(ds map[string]fsm.Delay) {
		promote(s.delays, term, len(ds), maps.All(ds), func(name string, d fsm.Delay) lease.Entry {
			return lease.Entry{ID: markKey(name, d.Token), TTL: d.Delay}
		})
	})
	s.promoteBudgets(term)
}

// promote starts manager m for term with one entry per item.
func promote[K, V any](m *lease.Manager, term uint64, n int, items iter.Seq2[K, V], entry func(K, V) lease.Entry) {
	es := make([]lease.Entry, 0, n)
	for k, v := range items {
		es = append(es, entry(k, v))
	}
	m.Promote(term, es)
}

// demoteTimers stops every leader timer (leadership lost, or Close).
func (s *Server) demoteTimers() {
	s.lease.Demote()
	s.marks.Demote()
	s.delays.Demote()
	s.holds.Demote()
}

// expire is the lease manager's callback for a session whose deadline
// passed in leadership term.
func (s *Server) expire(id string, term uint64) {
	if r := s.proposeTimed(s.lease, id, term, fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: id, TimeUnixNano: wallclock.Now().UnixNano(), Term: term}); r != nil {
		s.metrics.sessionsExpired.Inc()
		if holds := r.HoldsGrantedAt; len(holds) > 0 {
			s.metrics.lock.expiredHolding.Inc()
			s.metrics.lock.holdsExpired.Add(float64(len(holds)))
			for _, g := range holds {
				s.metrics.lock.holdEnded(endExpired, g)
			}
		}
		s.log.Info("session expired", "session", id)
	}
}

// proposeTimed proposes the command a leader timer of manager m decided
// (for key, in leadership term): only while this node still leads in that
// term (verified after the timer fired), and bound to that term so Apply
// ignores it if it commits in a later one. A failed proposal is retried
// after an election timeout if the node still leads. It returns Apply's
// result, nil when the command was not applied.
func (s *Server) proposeTimed(m *lease.Manager, key string, term uint64, t fsm.CmdType, msg proto.Message) *fsm.Result {
	// Under leaderMu: establish holds it from Promote until it records the
	// promoted term, so a timer firing in between waits instead of being
	// dropped (and its entry left expiring for the whole term).
	s.leaderMu.Lock()
	current := s.promotedTerm.Load()
	s.leaderMu.Unlock()
	if current != term {
		return nil
	}
	if err := s.linearizable(); err != nil {
		if errors.Is(err, errNoFreshQuorum) {
			// Raft still says leader, but no quorum answered in time
			// (acks.go): the decision stands and is tried again, as after
			// a failed proposal, or it would be lost for the whole term.
			m.Retry(key, s.cfg.ElectionTimeout)
		}
		return nil // otherwise no longer leader: Demote clears the timers
	}
	r, err := s.propose(t, msg)
	if err != nil {
		s.log.Warn("propose of a timed command failed", "type", t, "key", key, "err", err)
		m.Retry(key, s.cfg.ElectionTimeout)
		return nil
	}
	return r
}

// clearMark is the marks manager's callback for a completion mark whose
// retention passed.
func (s *Server) clearMark(key string, term uint64) {
	name, token, ok := parseMarkKey(key)
	if ok && s.proposeTimed(s.marks, key, term, fsm.CmdClearMark, &fsmv1.ClearMark{Name: name, Token: token, Term: term}) != nil {
		s.metrics.lock.marksExpired.Inc()
		s.log.Info("completion mark expired", "lock", name, "token", token)
	}
}

// undelay is the lock-delay manager's callback: the delay started by an
// expired hold (key: lock and that hold's token) has run in full on this
// leader; grant again.
func (s *Server) undelay(key string, term uint64) {
	if name, token, ok := parseMarkKey(key); ok {
		s.proposeTimed(s.delays, key, term, fsm.CmdUndelay, &fsmv1.Undelay{Name: name, Token: token, Term: term, TimeUnixNano: wallclock.Now().UnixNano()})
	}
}

// leadershipChanges returns a channel closed at the next leadership change
// of this node (gained or lost).
func (s *Server) leadershipChanges() <-chan struct{} {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	return s.leaderChanged
}

// linearizable makes a read on this node linearizable: this node must be the
// leader of a term whose Barrier has finished (so every entry an earlier
// leader acknowledged is applied here), still leader after the request was
// received (VerifyLeader, started after this call), and in the same term. Every write acknowledged
// before the read began is then applied in the FSM.
func (s *Server) linearizable() error {
	term := s.promotedTerm.Load()
	if term == 0 {
		return raft.ErrNotLeader
	}
	// One VerifyLeader serves every request that arrived before it started
	// (verify.go): under load, one round of heartbeats per batch of
	// requests instead of one per request.
	err := s.verify.do(func() error {
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
func (s *Server) transferOnShutdown() {
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
			resp, err := s.fwd.lockClient(m.API).Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
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
func (s *Server) recordSelf() error {
	if m, ok := s.fsm.Member(s.nodeID); ok && m.API == s.apiURL && m.Raft == string(s.trans.LocalAddr()) {
		return nil
	}
	_, err := s.propose(fsm.CmdSetMember, &fsmv1.SetMember{NodeId: s.nodeID, ApiUrl: s.apiURL, RaftAddress: string(s.trans.LocalAddr())})
	return err
}
