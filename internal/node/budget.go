package node

import (
	"strconv"
	"strings"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Hold budgets on the leader (docs/lock-semantics.md). A hold with a budget
// gets a timer in s.holds when the leader applies its grant (the grant
// event carries the budget); a new leader restarts every budget in full
// from its establish time, so the server ends a hold only later than its
// client gives it up, never earlier. When a budget runs out the leader
// proposes EndHold, which Apply carries out only while that very hold
// (session and token) is still there.

// holdKey names a hold in the budget manager: its token, session and lock.
// Session ids are the server's random hex (no space); the name comes last
// and may hold anything.
func holdKey(name, session string, token uint64) string {
	return strconv.FormatUint(token, 10) + " " + session + " " + name
}

// parseHoldKey undoes holdKey.
func parseHoldKey(key string) (name, session string, token uint64, ok bool) {
	tok, rest, ok1 := strings.Cut(key, " ")
	session, name, ok2 := strings.Cut(rest, " ")
	token, err := strconv.ParseUint(tok, 10, 64)
	return name, session, token, ok1 && ok2 && err == nil
}

// holdTimerEvent keeps a manager of per-hold timers (budgets: started by
// a grant; revoke graces: by a release request) in step with one applied
// event: an event of kind start with a duration starts the hold's timer,
// any end of a hold stops its own.
func holdTimerEvent(m *lease.Manager, e *fsm.Event, start fsm.EventKind) {
	if m == nil {
		return // a fanout without these timers (tests)
	}
	switch e.Kind {
	case start:
		if e.DurationMs > 0 {
			m.Created(holdKey(e.Name, e.Session, e.Token), ms(e.DurationMs))
		}
	case fsm.EventReleased, fsm.EventExpired, fsm.EventForceReleased, fsm.EventCompleted, fsm.EventHoldExpired:
		m.Removed(holdKey(e.Name, e.Session, e.Token))
	}
}

// promoteHoldTimers starts in full, for term, every per-hold timer that
// with lists (fsm WithBudgets or WithRevokeGraces) in m (promoteTimers).
func promoteHoldTimers(m *lease.Manager, term uint64, with func(func([]fsm.Budget))) {
	with(func(bs []fsm.Budget) {
		es := make([]lease.Entry, len(bs))
		for i, b := range bs {
			es[i] = lease.Entry{ID: holdKey(b.Name, b.Session, b.Token), TTL: b.MaxHold}
		}
		m.Promote(term, es)
	})
}

// endHold is the budget manager's callback: the hold's budget has run out
// in full on this leader.
func (s leaderTimers) endHold(key string, term uint64) {
	name, session, token, ok := parseHoldKey(key)
	if !ok {
		return
	}
	r := s.proposeTimed(s.holds, key, term, fsm.CmdEndHold, &fsmv1.EndHold{Name: name, SessionId: session, Token: token, Term: term, TimeUnixNano: wallclock.Now().UnixNano()})
	if r != nil && !r.GrantedAt.IsZero() {
		s.metrics.lock.HoldEnded(endExpired, r.GrantedAt)
		s.log.Info("hold budget ran out: hold ended", "lock", name, "session", session, "token", token)
	}
}
