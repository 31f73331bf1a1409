package server

import (
	"strconv"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
)

// fanout is the FSM's one event sink on this node: it hands each applied
// entry's events to everything that follows Apply: the lease timers of
// sessions, completion marks and lock-delays, the blocked Acquire calls and
// the watch history. It runs under the FSM's lock, so every consumer only
// records and never blocks.
type fanout struct {
	lease   *lease.Manager // session leases
	marks   *lease.Manager // completion marks, keyed by markKey
	delays  *lease.Manager // lock-delays, keyed by markKey(name, token)
	holds   *lease.Manager // hold budgets, keyed by holdKey
	waiters *waiters
	hub     *hub
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

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// Events implements fsm.EventSink. The lease managers ignore what they hear
// while inactive (not the leader): a new leader reads the state when it
// starts them.
func (o *fanout) Events(index uint64, evs []fsm.Event) {
	for i := range evs {
		e := &evs[i]
		holdEvent(o.holds, e)
		switch e.Kind {
		case fsm.EventSessionCreated:
			o.lease.Created(e.Session, ms(e.DurationMs))
		case fsm.EventSessionRemoved:
			o.lease.Removed(e.Session)
		case fsm.EventSessionRevoked:
			o.lease.Revoked(e.Session)
		case fsm.EventGranted:
			// Only a queued request has a blocked call to wake; a grant at
			// once finds none.
			o.waiters.notify(waitKey{e.Session, e.Name, e.Seq}, waitOutcome{token: e.Token, maxHold: ms(e.DurationMs)})
		case fsm.EventDequeued:
			o.waiters.notify(waitKey{e.Session, e.Name, e.Seq}, waitOutcome{dropped: true})
		case fsm.EventCompleted:
			o.marks.Created(markKey(e.Name, e.Token), ms(e.DurationMs))
		case fsm.EventMarkCleared:
			o.marks.Removed(markKey(e.Name, e.Token))
		case fsm.EventDelayStarted:
			o.delays.Created(markKey(e.Name, e.Token), ms(e.DurationMs))
		case fsm.EventDelayEnded:
			o.delays.Removed(markKey(e.Name, e.Token))
		}
	}
	o.hub.Events(index, evs)
}

// Reset implements fsm.EventSink: the state was replaced. Only the watch
// history keeps what it implies; the lease managers are inactive then (a
// restore happens on a follower, at start-up, or before a new leader starts
// its timers from the state).
func (o *fanout) Reset(from uint64) {
	o.hub.Reset(from)
}
