package fsm

import (
	"strings"
)

// Events: what Apply did to the locks, in apply order, for the watch stream.
// They are derived from the applied log only, so every replica produces the
// same events with the same positions; nothing here reads a clock.

// EventKind is what happened to a lock. Values are the numbers of
// lockd.v1.EventKind.
type EventKind int32

// Event kinds.
const (
	EventGranted       EventKind = 1  // a session got the lock (at once or from the queue)
	EventReleased      EventKind = 2  // its holder released it (release, cancel, close)
	EventExpired       EventKind = 3  // its holder's session expired while holding
	EventQueued        EventKind = 4  // a session queued for it
	EventDequeued      EventKind = 5  // a queued session left without a grant
	EventCompleted     EventKind = 6  // its holder set a completion mark (the hold ends)
	EventMarkCleared   EventKind = 7  // its completion mark ended
	EventDelayStarted  EventKind = 8  // a lock-delay began after an expired holder
	EventDelayEnded    EventKind = 9  // the lock-delay ended (or was replaced)
	EventForceReleased EventKind = 10 // its holder's force-released session ended
	EventValueChanged  EventKind = 11 // its holder changed the hold's value (Proclaim)
	// EventHeld is not a change: a hold as it is (Holding).
	EventHeld EventKind = 101
)

// Event is one change of a lock, as the watch stream reports it.
type Event struct {
	// Index is the Raft log index of the entry that caused the event.
	Index uint64
	// Num is the event's 1-based number among its entry's events.
	Num uint32
	// Kind is what happened.
	Kind EventKind
	// Name is the lock's name.
	Name string
	// Session and Owner are the session concerned and its owner label.
	Session, Owner string
	// Token is the hold's (or mark's, or expired hold's) token; 0 for
	// queue events.
	Token uint64
	// Mode is ModeExclusive or ModeShared for hold and queue events.
	Mode int32
	// Limit is the lock's limit (1: a mutex; more: a semaphore).
	Limit uint32
	// Value is the hold's or wait's value (granted, queued, value changed).
	Value []byte
}

// EventSink receives the events of each applied log entry. It is called
// synchronously from Apply, with the FSM's lock held: it must not block and
// must not call back into the FSM. It owns the slice it is given.
type EventSink interface {
	// Events are the events of the entry at index, in order.
	Events(index uint64, evs []Event)
	// Reset says the state was replaced (a snapshot restore): events before
	// it are unknown to this replica. from is the first log index whose
	// events will follow, or 0 when not known yet; a Reset(0) is followed by
	// a Reset with the index before the next entry's events.
	Reset(from uint64)
}

// Holding calls fn, while no command can be applied, with one EventHeld
// (without a position) for each hold of the locks whose names start with
// prefix, by name, then in token order. Events published while fn runs
// cannot exist, so fn may read where the event stream stands and know the
// holds are exactly those at that point.
func (f *FSM) Holding(prefix string, fn func([]Event)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var evs []Event
	f.ascendFrom(prefix, func(l *lock) bool { // the prefix's range only
		if !strings.HasPrefix(l.name, prefix) {
			return false
		}
		for _, h := range l.holders {
			evs = append(evs, Event{Kind: EventHeld, Name: l.name, Session: h.session, Owner: f.ownerOf(h.session),
				Token: h.token, Mode: h.mode, Limit: l.limit, Value: h.value})
		}
		return true
	})
	fn(evs)
}

// SetEventSink sets the sink of the events. Call it before Apply is first
// called (before Raft starts).
func (f *FSM) SetEventSink(s EventSink) { f.sink = s }

// event records an event of the entry being applied.
func (f *FSM) event(kind EventKind, l *lock, session string, token uint64, mode int32, value []byte) {
	if f.sink == nil || !f.inLog {
		return
	}
	owner := ""
	if s := f.sessions[session]; s != nil {
		owner = s.owner
	} else if l.mark != nil && l.mark.session == session {
		owner = l.mark.owner // the mark outlives its session
	}
	f.pending = append(f.pending, Event{Kind: kind, Name: l.name, Session: session, Owner: owner, Token: token, Mode: mode, Limit: l.limit, Value: value})
}

// flushEvents numbers the entry's events and hands them to the sink.
func (f *FSM) flushEvents(index uint64) {
	if f.restored {
		f.restored = false
		f.sink.Reset(index)
	}
	if len(f.pending) == 0 {
		return
	}
	evs := f.pending
	f.pending = nil
	for i := range evs {
		evs[i].Index, evs[i].Num = index, uint32(i+1)
	}
	f.sink.Events(index, evs)
}
