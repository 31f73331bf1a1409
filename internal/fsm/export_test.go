package fsm

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// Caps are the caps Apply enforces, for tests.
type Caps struct {
	Sessions, LocksPerSession, Waiters, Results, Marks, DelayLocks, Members int
	// Policies is the lock policy cap; 0 in SetCaps keeps MaxPolicies.
	Policies int
}

// CurrentCaps returns the caps in force.
func CurrentCaps() Caps {
	l := limits
	return Caps{l.sessions, l.locksPerSession, l.waiters, l.results, l.marks, l.delayLocks, l.members, l.policies}
}

// SetCaps replaces the caps until tb ends, so a test reaches them in a few
// commands. Tests of this package do not run in parallel.
func SetCaps(tb testing.TB, c Caps) {
	old := limits
	tb.Cleanup(func() { limits = old })
	limits.sessions, limits.locksPerSession, limits.waiters, limits.results = c.Sessions, c.LocksPerSession, c.Waiters, c.Results
	limits.marks, limits.delayLocks, limits.members = c.Marks, c.DelayLocks, c.Members
	if c.Policies > 0 {
		limits.policies = c.Policies
	}
}

// CheckCounts reports whether the counts the caps read match the locks they
// are derived from.
func (f *FSM) CheckCounts() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	want := newCounts()
	for _, l := range f.locks {
		want.add(l)
	}
	got := f.counts
	if got.marks != want.marks || got.delayLocks != want.delayLocks || len(got.markedBy) != len(want.markedBy) {
		return fmt.Errorf("counts: got %d marks %d delay locks %v, want %d %d %v", got.marks, got.delayLocks, got.markedBy, want.marks, want.delayLocks, want.markedBy)
	}
	for id, n := range want.markedBy {
		if got.markedBy[id] != n {
			return fmt.Errorf("counts: session %s has %d marks, counted %d", id, n, got.markedBy[id])
		}
	}
	return nil
}

// CheckNames reports whether the name index holds exactly the lock table:
// the same locks (the very values), each once, in strictly ascending name
// order.
func (f *FSM) CheckNames() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var err error
	n, prev := 0, ""
	f.names.Ascend(func(l *lock) bool {
		switch {
		case n > 0 && l.name <= prev:
			err = fmt.Errorf("names: %q after %q", l.name, prev)
		case f.locks[l.name] != l:
			err = fmt.Errorf("names: %q is not the table's lock of that name", l.name)
		}
		n, prev = n+1, l.name
		return err == nil
	})
	if err == nil && n != len(f.locks) {
		err = fmt.Errorf("names: %d in the index, %d in the table", n, len(f.locks))
	}
	return err
}

// LockNames returns the lock table's names from the map (not the index),
// sorted.
func (f *FSM) LockNames() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return slices.Sorted(maps.Keys(f.locks))
}

// SetNamesDegree makes FSMs created until tb ends use a name index of the
// given degree (2: nodes of at most 3 names).
func SetNamesDegree(tb testing.TB, d int) {
	old := namesDegree
	tb.Cleanup(func() { namesDegree = old })
	namesDegree = d
}
