package fsm

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Hold budgets: an acquire may ask for a max hold, a lock name may have a
// policy with a default, and the caller's identity may have a ceiling (from
// the leader's auth rules, carried in the command). Apply fixes the hold's
// budget when it decides the acquire (granted or queued) from the command
// and the policy table only, and the leader's timer, started when it
// applies the grant, ends the hold with EndHold when the budget has run out
// on its own clock. Apply never reads a clock.

// MaxHoldMs bounds a hold budget, a policy's default and an identity's
// ceiling (30 days).
const MaxHoldMs = 30 * 24 * 3600 * 1000

// policy is a lock name's replicated rule; it outlives the lock.
type policy struct {
	name             string
	defaultMaxHoldMs int64
	revokeGraceMs    int64
}

// LockPolicy is a lock name's policy, for the server.
type LockPolicy struct {
	// DefaultMaxHold is the budget of a hold whose acquire asked none.
	DefaultMaxHold time.Duration
	// RevokeGrace is how long after an admin's RequestRelease the holder's
	// session is revoked (0: an admin's request only asks).
	RevokeGrace time.Duration
}

// Budget is one hold that has a budget, for the leader's timers.
type Budget struct {
	// Name, Session and Token name the hold.
	Name, Session string
	Token         uint64
	// MaxHold is its budget.
	MaxHold time.Duration
}

// ValidateSetLockPolicy reports why Apply refuses c for its fields alone: the
// name, a default outside [0, MaxHoldMs], and a revoke grace neither 0 nor
// in [MinRevokeGraceMs, MaxRevokeGraceMs].
func ValidateSetLockPolicy(c *fsmv1.SetLockPolicy) error {
	if err := ValidateName(c.Name); err != nil {
		return err
	}
	if err := checkGraceMs(c.RevokeGraceMs); err != nil {
		return err
	}
	return checkHoldMs("default max hold", c.DefaultMaxHoldMs)
}

func checkHoldMs(what string, ms int64) error {
	if ms < 0 || ms > MaxHoldMs {
		return fmt.Errorf("%s %d ms is outside [0, %d]", what, ms, int64(MaxHoldMs))
	}
	return nil
}

// budgetOf returns the budget a grant of acquire c gets: the request's, or
// else the lock policy's default, capped by the identity's ceiling; the
// minimum of those that are set, 0 when none is.
func (f *FSM) budgetOf(c *fsmv1.Acquire) int64 {
	b := c.MaxHoldMs
	if b == 0 {
		if p := f.policies[c.Name]; p != nil {
			b = p.defaultMaxHoldMs
		}
	}
	if ceil := c.MaxHoldCeilingMs; ceil > 0 && (b == 0 || ceil < b) {
		b = ceil
	}
	return b
}

func (f *FSM) applySetLockPolicy(c *fsmv1.SetLockPolicy) *Result {
	if err := ValidateSetLockPolicy(c); err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	if c.DefaultMaxHoldMs == 0 && c.RevokeGraceMs == 0 {
		delete(f.policies, c.Name)
		return &Result{}
	}
	p := f.policies[c.Name]
	if p == nil {
		if len(f.policies) >= limits.policies {
			return fail(CodeTooMany, "%d lock policies exist already", limits.policies)
		}
		p = &policy{name: c.Name}
		f.policies[c.Name] = p
	}
	p.defaultMaxHoldMs, p.revokeGraceMs = c.DefaultMaxHoldMs, c.RevokeGraceMs
	return &Result{}
}

// applyEndHold ends the hold c names (lock, session, token) as an expiry
// ends it: the next waiters are granted, or a lock-delay starts. A hold
// that is gone (released, expired, or ended already) is left alone, so a
// late or repeated EndHold never ends a newer grant.
func (f *FSM) applyEndHold(c *fsmv1.EndHold, term uint64) *Result {
	if c.Term != 0 && term != 0 && c.Term != term {
		return fail(CodeInvalid, "stale end of hold decided in term %d, committed in term %d", c.Term, term)
	}
	l := f.locks[c.Name]
	if l == nil {
		return &Result{}
	}
	i := slices.IndexFunc(l.holders, func(h *hold) bool { return h.token == c.Token })
	if i < 0 || l.holders[i].session != c.SessionId {
		return &Result{}
	}
	h := l.holders[i]
	f.removeHold(l, h, EventHoldExpired)
	if l.delayMs > 0 {
		f.startDelay(l, h)
	}
	f.promote(l, c.TimeUnixNano)
	return &Result{GrantedAt: time.Unix(0, h.granted)}
}

// Policy returns the policy of lock name, false when it has none.
func (f *FSM) Policy(name string) (LockPolicy, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p := f.policies[name]
	if p == nil {
		return LockPolicy{}, false
	}
	return LockPolicy{DefaultMaxHold: ms(p.defaultMaxHoldMs), RevokeGrace: ms(p.revokeGraceMs)}, true
}

// WithBudgets calls fn with every hold that has a budget, by lock name and
// token, while no command can be applied (see WithSessions).
func (f *FSM) WithBudgets(fn func([]Budget)) {
	f.withHoldTimers(func(h *hold) int64 { return h.maxHoldMs }, fn)
}

// withHoldTimers calls fn, while no command can be applied, with every hold
// for which d returns more than 0, by lock name and token, that duration in
// Budget.MaxHold.
func (f *FSM) withHoldTimers(d func(*hold) int64, fn func([]Budget)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var bs []Budget
	f.names.Ascend(func(l *lock) bool {
		for _, h := range l.holders {
			if ms := d(h); ms > 0 {
				bs = append(bs, Budget{Name: l.name, Session: h.session, Token: h.token, MaxHold: time.Duration(ms) * time.Millisecond})
			}
		}
		return true
	})
	fn(bs)
}

// statePolicies writes the policy table by name.
func (f *FSM) statePolicies() []*fsmv1.LockPolicy {
	var out []*fsmv1.LockPolicy
	for _, name := range slices.Sorted(maps.Keys(f.policies)) {
		p := f.policies[name]
		out = append(out, &fsmv1.LockPolicy{Name: p.name, DefaultMaxHoldMs: p.defaultMaxHoldMs, RevokeGraceMs: p.revokeGraceMs})
	}
	return out
}

// decodePolicies checks and builds a snapshot's policy table.
func decodePolicies(pps []*fsmv1.LockPolicy) (map[string]*policy, error) {
	if len(pps) > limits.policies {
		return nil, fmt.Errorf("snapshot: %d lock policies, more than %d", len(pps), limits.policies)
	}
	out := make(map[string]*policy, len(pps))
	for _, pp := range pps {
		switch {
		case out[pp.Name] != nil:
			return nil, fmt.Errorf("snapshot: duplicate lock policy %q", pp.Name)
		case ValidateSetLockPolicy(&fsmv1.SetLockPolicy{Name: pp.Name, DefaultMaxHoldMs: pp.DefaultMaxHoldMs, RevokeGraceMs: pp.RevokeGraceMs}) != nil || pp.DefaultMaxHoldMs == 0 && pp.RevokeGraceMs == 0:
			return nil, fmt.Errorf("snapshot: bad lock policy %q", pp.Name)
		}
		out[pp.Name] = &policy{name: pp.Name, defaultMaxHoldMs: pp.DefaultMaxHoldMs, revokeGraceMs: pp.RevokeGraceMs}
	}
	return out, nil
}

// errBadBudget is a snapshot hold or wait with a budget out of range.
var errBadBudget = errors.New("bad hold budget")

// ms converts the log's milliseconds to a duration.
func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
