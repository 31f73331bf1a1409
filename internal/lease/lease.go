// Package lease keeps the leader-side deadlines of timed entries: session
// leases, and (in managers of their own, without grace) completion marks
// and lock-delays.
//
// Deadlines live on the leader, not in the Raft log: a KeepAlive moves a
// session's deadline to receive time + TTL + grace on the leader's monotonic
// clock, and when an entry's deadline passes the manager asks its owner to
// propose the command that ends it (ExpireSession, ClearMark, Undelay). A
// manager is inactive (answers no KeepAlive and ends nothing) until Promote
// is called after the new leader's Barrier; Promote restarts every deadline
// in full, so a leader change can only make an entry last longer, never
// shorter. Demote clears every timer. A decision to end an entry is final
// for the term: a KeepAlive never revives it, also while a failed proposal
// is retried.
package lease

import (
	"errors"
	"sync"
	"time"
)

// Errors returned by KeepAlive.
var (
	// ErrNotActive means this node is not a leader that has finished its
	// Barrier; the client should retry (on the leader).
	ErrNotActive = errors.New("lease: not the active leader")
	// ErrUnknown means the session does not exist (never created, closed or
	// expired).
	ErrUnknown = errors.New("lease: session not found")
	// ErrExpiring means the leader decided to expire the session; it is never
	// revived.
	ErrExpiring = errors.New("lease: session expired")
	// ErrRevoked means an operator force-released the session.
	ErrRevoked = errors.New("lease: session revoked")
)

// Entry is what Promote needs to know of one timed item: a session (its TTL,
// whether it was revoked), or, in the managers the server keeps for them, a
// completion mark or a lock-delay (its retention or delay as TTL).
type Entry struct {
	ID      string
	TTL     time.Duration
	Revoked bool
}

type entry struct {
	ttl      time.Duration
	deadline time.Time
	timer    *time.Timer
	revoked  bool
	expiring bool
}

// Manager holds the deadlines. Its methods are safe for concurrent use.
type Manager struct {
	grace  time.Duration
	expire func(id string, term uint64)

	mu      sync.Mutex
	active  bool
	term    uint64 // the leadership term Promote was called for
	gen     uint64 // bumped by Promote and Demote; stale timers check it
	entries map[string]*entry
}

// New returns an inactive manager. expire is called (in its own goroutine)
// when an entry's deadline passes, with the term of the leadership that
// promoted the manager; it should verify leadership and propose the expiry
// bound to that term, then call Retry if the proposal failed while still
// leader.
func New(grace time.Duration, expire func(id string, term uint64)) *Manager {
	return &Manager{grace: grace, expire: expire, entries: map[string]*entry{}}
}

// Promote activates the manager for a leadership term with every entry's
// deadline at now + TTL + grace.
func (m *Manager) Promote(term uint64, entries []Entry) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clearLocked()
	m.active = true
	m.term = term
	for _, s := range entries {
		e := &entry{ttl: s.TTL, revoked: s.Revoked}
		m.entries[s.ID] = e
		m.armLocked(s.ID, e, now.Add(s.TTL+m.grace))
	}
}

// Demote deactivates the manager and stops every timer.
func (m *Manager) Demote() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clearLocked()
	m.active = false
}

func (m *Manager) clearLocked() {
	m.gen++
	for _, e := range m.entries {
		e.timer.Stop()
	}
	clear(m.entries)
}

func (m *Manager) armLocked(id string, e *entry, deadline time.Time) {
	e.deadline = deadline
	gen := m.gen
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timer = time.AfterFunc(time.Until(deadline), func() { m.fire(id, e, gen) })
}

func (m *Manager) fire(id string, e *entry, gen uint64) {
	m.mu.Lock()
	if m.gen != gen || m.entries[id] != e || e.expiring {
		m.mu.Unlock()
		return
	}
	if now := time.Now(); now.Before(e.deadline) {
		// A KeepAlive moved the deadline after the timer was set.
		m.armLocked(id, e, e.deadline)
		m.mu.Unlock()
		return
	}
	e.expiring = true
	term := m.term
	m.mu.Unlock()
	m.expire(id, term)
}

// refire calls expire again for an entry whose expiry was already decided
// (Retry): the decision stands, so the deadline is not looked at again.
func (m *Manager) refire(id string, e *entry, gen uint64) {
	m.mu.Lock()
	if m.gen != gen || m.entries[id] != e || !e.expiring {
		m.mu.Unlock()
		return
	}
	term := m.term
	m.mu.Unlock()
	m.expire(id, term)
}

// Retry calls expire again after delay for an entry whose expiry proposal
// failed while this node may still be leader. The entry stays decided
// meanwhile: no KeepAlive of this term revives it (it answers ErrExpiring),
// or a KeepAlive arriving between a failed proposal and its retry could
// extend a lease the leader already gave up on.
func (m *Manager) Retry(id string, delay time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[id]
	if !m.active || e == nil || !e.expiring {
		return
	}
	gen := m.gen
	e.timer = time.AfterFunc(delay, func() { m.refire(id, e, gen) })
}

// Created starts the deadline of a new entry (now + TTL + grace). It is a
// no-op on an inactive manager: Promote will pick the entry up.
func (m *Manager) Created(id string, ttl time.Duration) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.active || m.entries[id] != nil {
		return
	}
	e := &entry{ttl: ttl}
	m.entries[id] = e
	m.armLocked(id, e, now.Add(ttl+m.grace))
}

// Removed forgets an entry that ended (a session closed or expired, a mark
// cleared, a delay ended).
func (m *Manager) Removed(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		e.timer.Stop()
		delete(m.entries, id)
	}
}

// Revoked marks a session as force-released: it accepts no more KeepAlives
// and expires at its current deadline.
func (m *Manager) Revoked(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		e.revoked = true
	}
}

// KeepAlive extends a session's deadline to received + TTL + grace, where
// received is when the request reached this node. The caller must have
// verified leadership after received. It returns the session's TTL.
func (m *Manager) KeepAlive(id string, received time.Time) (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.active {
		return 0, ErrNotActive
	}
	e := m.entries[id]
	switch {
	case e == nil:
		return 0, ErrUnknown
	case e.expiring:
		return 0, ErrExpiring
	case e.revoked:
		return 0, ErrRevoked
	}
	if d := received.Add(e.ttl + m.grace); d.After(e.deadline) {
		e.deadline = d // the armed timer re-arms itself when it fires early
	}
	return e.ttl, nil
}

// Deadline returns an entry's current deadline, for tests and status.
func (m *Manager) Deadline(id string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[id]
	if e == nil {
		return time.Time{}, false
	}
	return e.deadline, true
}
