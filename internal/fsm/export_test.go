package fsm

import "testing"

// Caps are the caps Apply enforces, for tests.
type Caps struct {
	Sessions, LocksPerSession, Waiters, Results, Marks, DelayLocks, Members int
}

// CurrentCaps returns the caps in force.
func CurrentCaps() Caps {
	l := limits
	return Caps{l.sessions, l.locksPerSession, l.waiters, l.results, l.marks, l.delayLocks, l.members}
}

// SetCaps replaces the caps until tb ends, so a test reaches them in a few
// commands. Tests of this package do not run in parallel.
func SetCaps(tb testing.TB, c Caps) {
	old := limits
	tb.Cleanup(func() { limits = old })
	limits.sessions, limits.locksPerSession, limits.waiters, limits.results = c.Sessions, c.LocksPerSession, c.Waiters, c.Results
	limits.marks, limits.delayLocks, limits.members = c.Marks, c.DelayLocks, c.Members
}
