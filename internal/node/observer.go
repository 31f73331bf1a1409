package node

import (
	"strconv"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
)

// Fanout is the FSM's one event sink on this node: it hands each applied
// entry's events to everything that follows Apply: the lease timers of
// sessions, completion marks and lock-delays, the blocked Acquire calls,
// the session streams that deliver release requests and the watch history. It runs under the FSM's lock, so every consumer only
// records and never blocks.
type Fanout struct {
	Lease   *lease.Manager // session leases
	Marks   *lease.Manager // completion marks, keyed by MarkKey
	Delays  *lease.Manager // lock-delays, keyed by MarkKey(name, token)
	Holds   *lease.Manager // hold budgets, keyed by holdKey (budget.go)
	Graces  *lease.Manager // revoke graces, keyed by holdKey (revoke.go)
	Waiters *Waiters
	Notices *Notices // nil: none (tests)
	Hub     *Hub
}

// MarkKey names a completion mark (or a lock-delay) in its manager: the
// lock and the token that identifies the mark or delay.
func MarkKey(name string, token uint64) string { return strconv.FormatUint(token, 10) + " " + name }

// ParseMarkKey undoes MarkKey.
func ParseMarkKey(key string) (name string, token uint64, ok bool) {
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
func (o *Fanout) Events(index uint64, evs []fsm.Event) {
	for i := range evs {
		e := &evs[i]
		holdTimerEvent(o.Holds, e, fsm.EventGranted)
		holdTimerEvent(o.Graces, e, fsm.EventReleaseAsked)
		switch e.Kind {
		case fsm.EventSessionCreated:
			o.Lease.Created(e.Session, ms(e.DurationMs))
		case fsm.EventSessionRemoved:
			o.Lease.Removed(e.Session)
		case fsm.EventSessionRevoked:
			o.Lease.Revoked(e.Session)
		case fsm.EventGranted:
			// Only a queued request has a blocked call to wake; a grant at
			// once finds none.
			o.Waiters.Notify(WaitKey{e.Session, e.Name, e.Seq}, WaitOutcome{Token: e.Token, MaxHold: ms(e.DurationMs)})
		case fsm.EventDequeued:
			o.Waiters.Notify(WaitKey{e.Session, e.Name, e.Seq}, WaitOutcome{Dropped: true})
		case fsm.EventCompleted:
			o.Marks.Created(MarkKey(e.Name, e.Token), ms(e.DurationMs))
		case fsm.EventMarkCleared:
			o.Marks.Removed(MarkKey(e.Name, e.Token))
		case fsm.EventDelayStarted:
			o.Delays.Created(MarkKey(e.Name, e.Token), ms(e.DurationMs))
		case fsm.EventDelayEnded:
			o.Delays.Removed(MarkKey(e.Name, e.Token))
		}
	}
	if o.Notices != nil {
		o.Notices.Events(evs)
	}
	o.Hub.Events(index, evs)
}

// Reset implements fsm.EventSink: the state was replaced. Only the watch
// history keeps what it implies; the lease managers are inactive then (a
// restore happens on a follower, at start-up, or before a new leader starts
// its timers from the state).
func (o *Fanout) Reset(from uint64) {
	o.Hub.Reset(from)
}
