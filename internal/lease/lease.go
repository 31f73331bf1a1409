// Package lease keeps the leader-side deadlines of timed entries: session
// leases, and (in managers of their own, without grace) completion marks
// and lock-delays. It also holds the lease rule's client half beside the
// server half (rule.go), so that the safety invariant between them is read
// and tested in one place.
//
// Deadlines live on the leader, not in the Raft log: a KeepAlive moves a
// session's deadline to receive time + TTL + grace on the leader's monotonic
// clock, and when an entry's deadline passes the manager asks its owner to
// propose the command that ends it (ExpireSession, ClearMark, Undelay). A
// manager is inactive (answers no KeepAlive and ends nothing) until Promote
// is called after the new leader's Barrier; Promote restarts every deadline
// in full, so a leader change can only make an entry last longer, never
// shorter. Demote clears every deadline. A decision to end an entry is final
// for the term: a KeepAlive never revives it, also while a failed proposal
// is retried.
//
// A manager keeps one min-heap of entries ordered by when they are next
// looked at, and one timer for the earliest of them, so 100 000 sessions
// cost no goroutine and no timer each. A KeepAlive only moves the entry's
// deadline (no heap operation, no allocation); an entry whose turn comes
// with a deadline in the future goes back into the heap at that deadline,
// so each live entry costs at most one heap operation per TTL.
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
	// ID names the item: a session id, or a mark's or delay's key.
	ID string
	// TTL is how long the item lives after Promote (or its last KeepAlive)
	// before the grace is added.
	TTL time.Duration
	// Revoked marks a session an operator force-released: it accepts no
	// KeepAlive and expires at its deadline.
	Revoked bool
}

type entry struct {
	id       string
	ttl      time.Duration
	deadline time.Time
	when     time.Time // when the heap next looks at the entry
	index    int       // position in the heap, -1 when not in it
	revoked  bool
	expiring bool // decided: when is a retry time, not a deadline
}

// Manager holds the deadlines. Its methods are safe for concurrent use.
type Manager struct {
	grace  time.Duration
	expire func(id string, term uint64)

	mu      sync.Mutex
	active  bool
	term    uint64 // the leadership term Promote was called for
	entries map[string]*entry
	heap    []*entry
	timer   *time.Timer // fires at armed, the earliest when in the heap
	armed   time.Time   // zero when the timer is stopped
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
	if cap(m.heap) < len(entries) {
		m.heap = make([]*entry, 0, len(entries))
	}
	// One allocation for every entry: a new leader of 100 000 sessions
	// starts its leases in milliseconds.
	es := make([]entry, len(entries))
	for i, s := range entries {
		e := &es[i]
		d := ServerExpiry(now, s.TTL, m.grace)
		*e = entry{id: s.ID, ttl: s.TTL, revoked: s.Revoked, deadline: d, when: d, index: len(m.heap)}
		m.entries[s.ID] = e
		m.heap = append(m.heap, e)
	}
	for i := len(m.heap)/2 - 1; i >= 0; i-- {
		m.down(i)
	}
	m.rearmLocked()
}

// Demote deactivates the manager and stops its timer.
func (m *Manager) Demote() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clearLocked()
	m.active = false
}

func (m *Manager) clearLocked() {
	clear(m.entries)
	clear(m.heap) // let the entries be collected
	m.heap = m.heap[:0]
	m.rearmLocked()
}

// rearmLocked sets the timer to the earliest when in the heap. A timer that
// fires early (its entry was removed) finds nothing due and rearms.
func (m *Manager) rearmLocked() {
	if len(m.heap) == 0 {
		if m.timer != nil && !m.armed.IsZero() {
			m.timer.Stop()
		}
		m.armed = time.Time{}
		return
	}
	next := m.heap[0].when
	if m.armed.Equal(next) {
		return
	}
	m.armed = next
	if m.timer == nil {
		m.timer = time.AfterFunc(time.Until(next), m.fire)
		return
	}
	m.timer.Reset(time.Until(next))
}

// fire looks at every entry that is due: one whose deadline a KeepAlive
// moved goes back into the heap at its new deadline; one whose deadline
// passed is decided (expiring) and handed to expire; one already decided is
// a Retry, handed to expire again without looking at its deadline.
func (m *Manager) fire() {
	var due []string
	m.mu.Lock()
	now := time.Now()
	m.armed = time.Time{}
	for len(m.heap) > 0 && !m.heap[0].when.After(now) {
		e := m.heap[0]
		switch {
		case e.expiring:
			m.removeAt(0)
		case now.Before(e.deadline):
			e.when = e.deadline
			m.down(0)
			continue
		default:
			e.expiring = true
			m.removeAt(0)
		}
		due = append(due, e.id)
	}
	m.rearmLocked()
	term := m.term
	m.mu.Unlock()
	for _, id := range due {
		go m.expire(id, term)
	}
}

// Retry calls expire again after delay for an entry whose expiry proposal
// failed while this node may still be leader. The entry stays decided
// meanwhile: no KeepAlive of this term revives it (it answers ErrExpiring),
// or a KeepAlive arriving between a failed proposal and its retry could
// extend a lease the leader already gave up on.
func (m *Manager) Retry(id string, delay time.Duration) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[id]
	if !m.active || e == nil || !e.expiring || e.index >= 0 {
		return
	}
	e.when = now.Add(delay)
	m.push(e)
	m.rearmLocked()
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
	d := ServerExpiry(now, ttl, m.grace)
	e := &entry{id: id, ttl: ttl, deadline: d, when: d}
	m.entries[id] = e
	m.push(e)
	m.rearmLocked()
}

// Removed forgets an entry that ended (a session closed or expired, a mark
// cleared, a delay ended).
func (m *Manager) Removed(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		if e.index >= 0 {
			m.removeAt(e.index)
		}
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
	if d := ServerExpiry(received, e.ttl, m.grace); d.After(e.deadline) {
		// The entry stays in the heap at its older when; fire moves it.
		e.deadline = d
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

// Len returns the number of entries the manager holds.
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}
