package node

import (
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Revoke graces on the leader (docs/lock-semantics.md, "Asking a holder to
// let go"), the twin of the hold budgets (budget.go). An admin's
// RequestRelease on a lock whose policy has a revoke grace gives each hold
// its grace once: the EventReleaseAsked of that first time carries it, and
// the leader starts a timer in s.graces, keyed by holdKey. A new leader
// restarts every grace in full from its establish time (WithRevokeGraces),
// so the server revokes only later than the holder was told, never
// earlier. When a grace runs out the leader proposes RevokeHold, which
// Apply carries out only while that very hold (session and token) is still
// there: the holder's session is revoked as a force-release revokes it (no
// KeepAlive accepted; it expires at its current deadline, and only then is
// the lock granted to the next waiter).

// revokeHold is the grace manager's callback: the hold's revoke grace has
// run out in full on this leader.
func (s leaderTimers) revokeHold(key string, term uint64) {
	name, session, token, ok := parseHoldKey(key)
	if !ok {
		return
	}
	r := s.proposeTimed(s.graces, key, term, fsm.CmdRevokeHold, &fsmv1.RevokeHold{Name: name, SessionId: session, Token: token, Term: term, TimeUnixNano: wallclock.Now().UnixNano()})
	if r != nil && !r.GrantedAt.IsZero() {
		s.metrics.lock.holdsRevoked.Inc()
		s.log.Info("revoke grace ran out: holder's session revoked", "lock", name, "session", session, "token", token)
	}
}
