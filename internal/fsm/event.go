package fsm

import (
	"strings"
)

// Events: what Apply did, in apply order, the one channel out of the FSM.
// Lock events feed the watch stream; they and the session events also feed
// the leader's timers and the blocked Acquire calls. They are derived from
// the applied log only, so every replica produces the same events with the
// same positions; nothing here reads a clock.

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
	EventHoldExpired   EventKind = 12 // the hold's budget ran out (EndHold); its session lives on
	EventReleaseAsked  EventKind = 13 // someone asked the holder to let go (RequestRelease); no change
	// EventHeld is not a change: a hold as it is (Holding).
	EventHeld EventKind = 101

	// Session events, for the lease timers: never shown to watchers, so
	// they have no position (Num 0) and leave the lock events' numbers as
	// an older version gives them.
	EventSessionCreated EventKind = 201 // DurationMs: its TTL
	EventSessionRemoved EventKind = 202 // closed or expired (after its holds and waits ended)
	EventSessionRevoked EventKind = 203 // force-released (after its waits were dropped)
)

// Watched reports whether events of kind k are lock events, which the watch
// stream reports and numbers.
func (k EventKind) Watched() bool { return k < EventHeld }

// Event is one change of a lock, as the watch stream reports it, or of a
// session.
type Event struct {
	// Index is the Raft log index of the entry that caused the event.
	Index uint64
	// Num is a lock event's 1-based number among its entry's lock events
	// (0 for a session event).
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
	// Seq is the seq of the acquire that was granted, queued or dequeued.
	Seq uint64
	// DurationMs is, in the log's milliseconds, a created session's TTL, a
	// completion mark's retention (completed), a lock-delay (delay
	// started) or a hold's budget (granted; 0: none): what the leader's
	// timer for it runs.
	DurationMs int64
}

// EventSink receives the events of each applied log entry. It is called
// synchronously from Apply, with the FSM's lock held, in the same order on
// every replica: it must not block and must not call back into the FSM. It
// owns the slice it is given.
type EventSink interface {
	// Events are the events of the entry at index, in order.
	Events(index uint64, evs []Event)
	// Reset says the state was replaced (a snapshot restore, a Restore
	// command): events before it are unknown to this replica, and no event
	// tells of what the new state holds (a consumer that follows the state
	// reads it; the leader's timers do when they start). from is the first
	// log index whose
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
				Token: h.token, Mode: h.mode, Limit: l.limit, Value: valueBytes(h.value)})
		}
		return true
	})
	fn(evs)
}

// event records a lock event of the entry being applied and returns it, to
// add what only some kinds carry (nil when no sink records events). The
// pointer is valid until the next event.
func (f *FSM) event(kind EventKind, l *lock, session string, token uint64, mode int32, value []byte) *Event {
	if f.sink == nil {
		return nil
	}
	owner := ""
	if s := f.sessions[session]; s != nil {
		owner = s.owner
	} else if l.mark != nil && l.mark.session == session {
		owner = l.mark.owner // the mark outlives its session
	}
	f.pending = append(f.pending, Event{Kind: kind, Name: l.name, Session: session, Owner: owner, Token: token, Mode: mode, Limit: l.limit, Value: value})
	return &f.pending[len(f.pending)-1]
}

// sessionEvent records a session event of the entry being applied.
func (f *FSM) sessionEvent(kind EventKind, s *session) {
	if f.sink == nil {
		return
	}
	e := Event{Kind: kind, Session: s.id, Owner: s.owner}
	if kind == EventSessionCreated {
		e.DurationMs = s.ttlMs
	}
	f.pending = append(f.pending, e)
}

// flushEvents numbers the entry's events and hands them to the sink.
func (f *FSM) flushEvents(index uint64) {
	if f.restored && index != 0 { // index 0: ApplyCommand, outside the log
		f.restored = false
		f.sink.Reset(index)
	}
	if len(f.pending) == 0 {
		return
	}
	evs := f.pending
	f.pending = nil
	var n uint32
	for i := range evs {
		evs[i].Index = index
		if evs[i].Kind.Watched() {
			n++
			evs[i].Num = n
		}
	}
	f.sink.Events(index, evs)
}
