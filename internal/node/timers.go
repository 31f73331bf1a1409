package node

import (
	"errors"
	"iter"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// leaderTimers are the leader's timers: every session's lease, completion
// mark and lock-delay, started in full when leadership is established and
// stopped at once when it is lost, and their callbacks, which propose what
// the timer decided.
type leaderTimers struct{ *Node }

// promoteTimers starts the leader's timers of term in full: every
// session's lease, completion mark and lock-delay, each read under the FSM's
// lock so none is added or removed meanwhile.
func (s leaderTimers) promoteTimers(term uint64) {
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
			return lease.Entry{ID: MarkKey(name, m.Token), TTL: m.Retention}
		})
	})
	s.fsm.WithDelays(func(ds map[string]fsm.Delay) {
		promote(s.delays, term, len(ds), maps.All(ds), func(name string, d fsm.Delay) lease.Entry {
			return lease.Entry{ID: MarkKey(name, d.Token), TTL: d.Delay}
		})
	})
	promoteHoldTimers(s.holds, term, s.fsm.WithBudgets)
	promoteHoldTimers(s.graces, term, s.fsm.WithRevokeGraces)
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
func (s leaderTimers) demoteTimers() {
	s.lease.Demote()
	s.marks.Demote()
	s.delays.Demote()
	s.holds.Demote()
	s.graces.Demote()
}

// expire is the lease manager's callback for a session whose deadline
// passed in leadership term.
func (s leaderTimers) expire(id string, term uint64) {
	if r := s.proposeTimed(s.lease, id, term, fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: id, TimeUnixNano: wallclock.Now().UnixNano(), Term: term}); r != nil {
		s.metrics.sessionsExpired.Inc()
		if holds := r.HoldsGrantedAt; len(holds) > 0 {
			s.metrics.lock.expiredHolding.Inc()
			s.metrics.lock.holdsExpired.Add(float64(len(holds)))
			for _, g := range holds {
				s.metrics.lock.HoldEnded(endExpired, g)
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
func (s leaderTimers) proposeTimed(m *lease.Manager, key string, term uint64, t fsm.CmdType, msg proto.Message) *fsm.Result {
	// Under leaderMu: establish holds it from Promote until it records the
	// promoted term, so a timer firing in between waits instead of being
	// dropped (and its entry left expiring for the whole term).
	s.leaderMu.Lock()
	current := s.promotedTerm.Load()
	s.leaderMu.Unlock()
	if current != term {
		return nil
	}
	if err := s.Linearizable(); err != nil {
		if errors.Is(err, ErrNoFreshQuorum) {
			// Raft still says leader, but no quorum answered in time
			// (acks.go): the decision stands and is tried again, as after
			// a failed proposal, or it would be lost for the whole term.
			m.Retry(key, s.cfg.ElectionTimeout)
		}
		return nil // otherwise no longer leader: Demote clears the timers
	}
	r, err := s.Propose(t, msg)
	if err != nil {
		s.log.Warn("propose of a timed command failed", "type", t, "key", key, "err", err)
		m.Retry(key, s.cfg.ElectionTimeout)
		return nil
	}
	return r
}

// clearMark is the marks manager's callback for a completion mark whose
// retention passed.
func (s leaderTimers) clearMark(key string, term uint64) {
	name, token, ok := ParseMarkKey(key)
	if ok && s.proposeTimed(s.marks, key, term, fsm.CmdClearMark, &fsmv1.ClearMark{Name: name, Token: token, Term: term}) != nil {
		s.metrics.lock.marksExpired.Inc()
		s.log.Info("completion mark expired", "lock", name, "token", token)
	}
}

// undelay is the lock-delay manager's callback: the delay started by an
// expired hold (key: lock and that hold's token) has run in full on this
// leader; grant again.
func (s leaderTimers) undelay(key string, term uint64) {
	if name, token, ok := ParseMarkKey(key); ok {
		s.proposeTimed(s.delays, key, term, fsm.CmdUndelay, &fsmv1.Undelay{Name: name, Token: token, Term: term, TimeUnixNano: wallclock.Now().UnixNano()})
	}
}
