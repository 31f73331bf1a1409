package server

import (
	"strconv"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/lease"
)

// observer fans FSM events out to the lease manager, the completion-mark
// timers and the waiters.
type observer struct {
	lease   *lease.Manager
	marks   *lease.Manager // completion marks, keyed by markKey
	delays  *lease.Manager // lock-delays, keyed by markKey(name, token)
	waiters *waiters
}

// markKey names a completion mark (or a lock-delay) in its manager: the
// lock and the token that identifies the mark or delay.
func markKey(name string, token uint64) string { return strconv.FormatUint(token, 10) + " " + name }

// parseMarkKey undoes markKey.
func parseMarkKey(key string) (name string, token uint64, ok bool) {
	tok, name, ok := strings.Cut(key, " ")
	if !ok {
		return "", 0, false
	}
	token, err := strconv.ParseUint(tok, 10, 64)
	return name, token, err == nil
}

// MarkSet implements fsm.Observer.
func (o *observer) MarkSet(name string, token uint64, retentionMs int64) {
	if o.marks != nil {
		o.marks.Created(markKey(name, token), time.Duration(retentionMs)*time.Millisecond)
	}
}

// LockDelayed implements fsm.Observer.
func (o *observer) LockDelayed(name string, token uint64, delayMs int64) {
	if o.delays != nil {
		o.delays.Created(markKey(name, token), time.Duration(delayMs)*time.Millisecond)
	}
}

// DelayEnded implements fsm.Observer.
func (o *observer) DelayEnded(name string, token uint64) {
	if o.delays != nil {
		o.delays.Removed(markKey(name, token))
	}
}

// MarkCleared implements fsm.Observer.
func (o *observer) MarkCleared(name string, token uint64) {
	if o.marks != nil {
		o.marks.Removed(markKey(name, token))
	}
}

// SessionCreated implements fsm.Observer.
func (o *observer) SessionCreated(id string, ttlMs int64) {
	o.lease.Created(id, time.Duration(ttlMs)*time.Millisecond)
}

// SessionRemoved implements fsm.Observer.
func (o *observer) SessionRemoved(id string) { o.lease.Removed(id) }

// SessionRevoked implements fsm.Observer.
func (o *observer) SessionRevoked(id string) { o.lease.Revoked(id) }

// WaitGranted implements fsm.Observer.
func (o *observer) WaitGranted(session, name string, seq, token uint64) {
	o.waiters.notify(waitKey{session, name, seq}, waitOutcome{token: token})
}

// WaitDropped implements fsm.Observer.
func (o *observer) WaitDropped(session, name string, seq uint64) {
	o.waiters.notify(waitKey{session, name, seq}, waitOutcome{dropped: true})
}

// Restored: the leader re-promotes after a restore (it only happens on
// followers and at start-up, when the manager is inactive anyway).
func (o *observer) Restored() {}
