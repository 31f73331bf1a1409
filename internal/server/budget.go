package server

import (
	"context"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
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

// holdEvent keeps the budget timers in step with one applied event: a grant
// with a budget starts one, any end of a hold stops its own.
func holdEvent(m *lease.Manager, e *fsm.Event) {
	switch e.Kind {
	case fsm.EventGranted:
		if e.DurationMs > 0 {
			m.Created(holdKey(e.Name, e.Session, e.Token), ms(e.DurationMs))
		}
	case fsm.EventReleased, fsm.EventExpired, fsm.EventForceReleased, fsm.EventCompleted, fsm.EventHoldExpired:
		m.Removed(holdKey(e.Name, e.Session, e.Token))
	}
}

// promoteBudgets starts every hold budget of term in full (promoteTimers).
func (s *Server) promoteBudgets(term uint64) {
	s.fsm.WithBudgets(func(bs []fsm.Budget) {
		es := make([]lease.Entry, len(bs))
		for i, b := range bs {
			es[i] = lease.Entry{ID: holdKey(b.Name, b.Session, b.Token), TTL: b.MaxHold}
		}
		s.holds.Promote(term, es)
	})
}

// endHold is the budget manager's callback: the hold's budget has run out
// in full on this leader.
func (s *Server) endHold(key string, term uint64) {
	name, session, token, ok := parseHoldKey(key)
	if !ok {
		return
	}
	r := s.proposeTimed(s.holds, key, term, fsm.CmdEndHold, &fsmv1.EndHold{Name: name, SessionId: session, Token: token, Term: term, TimeUnixNano: wallclock.Now().UnixNano()})
	if r != nil && !r.GrantedAt.IsZero() {
		s.metrics.lock.holdEnded(endExpired, r.GrantedAt)
		s.log.Info("hold budget ran out: hold ended", "lock", name, "session", session, "token", token)
	}
}

// acquireBudget reads an Acquire request's max_hold and the caller's
// ceiling into cmd.
func (a *api) acquireBudget(ctx context.Context, m *lockdv1.AcquireRequest, cmd *fsmv1.Acquire) error {
	holdMs, err := a.budgetMs(m.MaxHold)
	if err != nil {
		return err
	}
	cmd.MaxHoldMs, cmd.MaxHoldCeilingMs = holdMs, a.s.guard.MaxHold(ctx).Milliseconds()
	return nil
}

// budgetPB is a grant's budget for an answer, nil for none.
func budgetPB(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// SetLockPolicy sets or removes a lock name's policy (admin).
func (a *api) SetLockPolicy(ctx context.Context, req *connect.Request[lockdv1.SetLockPolicyRequest]) (*connect.Response[lockdv1.SetLockPolicyResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.SetLockPolicy, func() (*connect.Response[lockdv1.SetLockPolicyResponse], error) {
		m := req.Msg
		cmd := &fsmv1.SetLockPolicy{Name: m.Name, TimeUnixNano: wallclock.Now().UnixNano()}
		if p := m.Policy; p != nil && p.DefaultMaxHold != nil {
			d := p.DefaultMaxHold.AsDuration()
			if p.DefaultMaxHold.CheckValid() != nil || d < 0 {
				return nil, a.s.invalid("default_max_hold must be a duration from 0 to 720h")
			}
			cmd.DefaultMaxHoldMs = d.Milliseconds()
			if d > 0 && cmd.DefaultMaxHoldMs == 0 {
				cmd.DefaultMaxHoldMs = 1
			}
		}
		if err := fsm.ValidateSetLockPolicy(cmd); err != nil {
			return nil, a.s.invalid("%v", err)
		}
		if _, err := a.propose(fsm.CmdSetLockPolicy, cmd); err != nil {
			return nil, err
		}
		a.s.log.Info("lock policy set", "lock", m.Name, "default_max_hold", time.Duration(cmd.DefaultMaxHoldMs)*time.Millisecond)
		return connect.NewResponse(&lockdv1.SetLockPolicyResponse{}), nil
	})
}

// policyPB is a lock's policy for DescribeLock, nil for none.
func (a *api) policyPB(name string) *lockdv1.LockPolicy {
	p, ok := a.s.fsm.Policy(name)
	if !ok {
		return nil
	}
	return &lockdv1.LockPolicy{DefaultMaxHold: budgetPB(p.DefaultMaxHold)}
}
