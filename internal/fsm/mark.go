package fsm

import (
	"time"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Completion marks and lock-delays: what keeps a lock in the table after
// its holders are gone, until the leader's timer ends it by a command.

// MaxRetentionMs bounds how long a completion mark is kept (400 days).
const MaxRetentionMs = 400 * 24 * 3600 * 1000

// mark is a completion mark as the state keeps it (the log's integers).
type mark struct {
	session     string
	owner       string
	token       uint64
	completed   int64 // Unix ns, display only
	retentionMs int64
}

// Mark is a completion mark: the job a lock guards was done.
type Mark struct {
	// Session is the session that completed the job.
	Session string
	// Owner is that session's owner.
	Owner string
	// Token is the token of the hold that completed it.
	Token uint64
	// CompletedAt is when (the proposer's wall clock; display only).
	CompletedAt time.Time
	// Retention is how long the mark is kept, from when the leader
	// starts its timer.
	Retention time.Duration
}

func (m *mark) view() *Mark {
	return &Mark{Session: m.session, Owner: m.owner, Token: m.token, CompletedAt: time.Unix(0, m.completed), Retention: time.Duration(m.retentionMs) * time.Millisecond}
}

// Delay is a running lock-delay.
type Delay struct {
	// Token is the token of the expired hold that started it.
	Token uint64
	// Delay is how long nothing is granted, from when the leader starts
	// its timer.
	Delay time.Duration
}

// counts are derived from the locks (rebuilt on restore), so the caps on
// marks and lock-delays decide the same on every replica.
type counts struct {
	marks      int            // locks with a completion mark
	markedBy   map[string]int // session id -> its live marks
	delayLocks int            // locks with a lock-delay, running or to come
	// byIdentity counts the live sessions of each identity (derived from
	// the sessions), for the server's per-identity session cap.
	byIdentity map[string]int
}

func newCounts() counts { return counts{markedBy: map[string]int{}, byIdentity: map[string]int{}} }

func (c *counts) add(l *lock) {
	if l.delayMs > 0 {
		c.delayLocks++
	}
	if l.mark != nil {
		c.addMark(l.mark)
	}
}

func (c *counts) remove(l *lock) {
	if l.delayMs > 0 {
		c.delayLocks--
	}
	if m := l.mark; m != nil {
		c.marks--
		if c.markedBy[m.session]--; c.markedBy[m.session] == 0 {
			delete(c.markedBy, m.session)
		}
	}
}

func (c *counts) addMark(m *mark) {
	c.marks++
	c.markedBy[m.session]++
}

// applyComplete marks the job of a lock done: the session must hold it
// exclusively with the token. The hold is released, every waiter is answered
// "already done", and the mark stays until the leader clears it after the
// retention. The mark counts toward the session's MaxLocksPerSession while
// it lives (like the hold it replaces) and toward MaxMarks.
func (f *FSM) applyComplete(c *fsmv1.Complete) *Result {
	fp := completeFingerprint(c)
	s, r := f.request(c.SessionId, c.Seq, c.Ack, fp, 0)
	if r != nil {
		return r
	}
	if err := ValidateComplete(c); err != nil {
		return f.remember(s, c.Seq, fp, fail(CodeInvalid, "%v", err))
	}
	h := s.holds[c.Name]
	if h == nil || h.token != c.Token {
		return f.remember(s, c.Seq, fp, fail(CodeNotHeld, "lock %q is not held with token %d by this session", c.Name, c.Token))
	}
	if h.mode != ModeExclusive {
		return f.remember(s, c.Seq, fp, fail(CodeInvalid, "only an exclusive hold can complete lock %q", c.Name))
	}
	if f.counts.marks >= limits.marks {
		return f.remember(s, c.Seq, fp, fail(CodeTooMany, "%d completion marks are kept already", limits.marks))
	}
	l := f.locks[c.Name]
	if e := f.removeHold(l, h, EventCompleted); e != nil {
		e.DurationMs = c.RetentionMs
	}
	// Every waiter is answered "already done", in queue order, in one pass
	// (removeWait per waiter would rescan the queue each time).
	queue := l.queue
	for _, w := range queue {
		delete(f.sessions[w.session].waits, l.name)
		f.dequeued(l, w)
	}
	l.queue = nil
	l.mark = &mark{session: s.id, owner: s.owner, token: h.token, completed: c.TimeUnixNano, retentionMs: c.RetentionMs}
	f.counts.addMark(l.mark)
	// An AcquireMany request answered "already done" here leaves its other
	// queues too: never part of a set.
	f.dropGroupsOf(queue, l.name, c.TimeUnixNano)
	return f.remember(s, c.Seq, fp, &Result{GrantedAt: time.Unix(0, h.granted)})
}

func (f *FSM) applyClearMark(c *fsmv1.ClearMark, term uint64) *Result {
	if c.Term != 0 && term != 0 && c.Term != term {
		return fail(CodeInvalid, "stale mark expiry decided in term %d, committed in term %d", c.Term, term)
	}
	if l := f.locks[c.Name]; l != nil && l.mark != nil && l.mark.token == c.Token {
		f.event(EventMarkCleared, l, l.mark.session, l.mark.token, ModeExclusive, nil)
		f.deleteLock(l) // a marked lock has no holders or waiters
	}
	return &Result{}
}

// startDelay delays l after its holder with token expired. The holder did
// not release: it may still be running. Nothing is granted for the
// lock-delay, counted from this expiry (the leader ends it with Undelay
// naming this token). The lock was counted toward MaxDelayLocks when it was
// created, so an expiry, which cannot be refused, never exceeds the cap.
func (f *FSM) startDelay(l *lock, h *hold) {
	token := h.token
	if l.delayed {
		f.event(EventDelayEnded, l, "", l.delayToken, 0, nil) // replaced by this one
	}
	if e := f.event(EventDelayStarted, l, h.session, token, h.mode, nil); e != nil {
		e.DurationMs = l.delayMs
	}
	l.delayed, l.delayToken = true, token
}

func (f *FSM) applyUndelay(c *fsmv1.Undelay, term uint64) *Result {
	if c.Term != 0 && term != 0 && c.Term != term {
		return fail(CodeInvalid, "stale end of lock-delay decided in term %d, committed in term %d", c.Term, term)
	}
	if l := f.locks[c.Name]; l != nil && l.delayed && l.delayToken == c.Token {
		f.event(EventDelayEnded, l, "", l.delayToken, 0, nil)
		l.delayed, l.delayToken = false, 0
		f.promote(l, c.TimeUnixNano)
	}
	return &Result{}
}

// WithDelays calls fn with every running lock-delay by lock name while no
// command can be applied (see WithSessions).
func (f *FSM) WithDelays(fn func(map[string]Delay)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := map[string]Delay{}
	// A running delay is on a lock with a lock-delay, which counts keep:
	// with none, a table of a million locks is not walked (0.3 s of a
	// new leader's start).
	if f.counts.delayLocks > 0 {
		for name, l := range f.locks {
			if l.delayed {
				out[name] = Delay{Token: l.delayToken, Delay: time.Duration(l.delayMs) * time.Millisecond}
			}
		}
	}
	fn(out)
}

// WithMarks calls fn with every completion mark while no command can be
// applied (see WithSessions).
func (f *FSM) WithMarks(fn func(map[string]Mark)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := map[string]Mark{}
	for name, l := range f.locks {
		if len(out) == f.counts.marks {
			break // all found (see WithDelays)
		}
		if l.mark != nil {
			out[name] = *l.mark.view()
		}
	}
	fn(out)
}
