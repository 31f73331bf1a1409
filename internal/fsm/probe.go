package fsm

import (
	"slices"
	"time"
)

// This file holds small read views for the server's metrics: each answers
// one question in O(1) (or O(holds of one session)) under the read lock,
// so the hot paths can afford them.

// QueuedAt returns when the wait of the acquire (session, name, seq) was
// queued, if it still waits.
func (f *FSM) QueuedAt(sessionID, name string, seq uint64) (time.Time, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[sessionID]
	if s == nil {
		return time.Time{}, false
	}
	if w := s.waits[name]; w != nil && w.seq == seq {
		return time.Unix(0, w.queued), true
	}
	return time.Time{}, false
}

// GrantedAt returns when the hold of lock name with token was granted, if
// it is a current grant.
func (f *FSM) GrantedAt(name string, token uint64) (time.Time, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if l := f.locks[name]; l != nil {
		for _, h := range l.holders {
			if h.token == token {
				return time.Unix(0, h.granted), true
			}
		}
	}
	return time.Time{}, false
}

// Delayed reports whether a lock-delay runs on lock name.
func (f *FSM) Delayed(name string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	l := f.locks[name]
	return l != nil && l.delayed
}

// HoldTimes returns when each current hold of a session was granted.
func (f *FSM) HoldTimes(sessionID string) []time.Time {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[sessionID]
	if s == nil {
		return nil
	}
	out := make([]time.Time, 0, len(s.holds))
	for _, h := range s.holds {
		out = append(out, time.Unix(0, h.granted))
	}
	return out
}

// SessionLocks returns the names of at most n locks a session holds and of
// at most n it waits for, each in name order.
func (f *FSM) SessionLocks(sessionID string, n int) (holding, waiting []string) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[sessionID]
	if s == nil {
		return nil, nil
	}
	return firstNames(s.holds, n), firstNames(s.waits, n)
}

// firstNames returns the n smallest keys of m, in order.
func firstNames[V any](m map[string]V, n int) []string {
	out := make([]string, 0, min(len(m), n+1))
	for k := range m {
		i, _ := slices.BinarySearch(out, k)
		if i >= n {
			continue
		}
		out = slices.Insert(out, i, k)
		if len(out) > n {
			out = out[:n]
		}
	}
	return out
}
