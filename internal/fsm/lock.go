package fsm

import (
	"fmt"
	"slices"
	"time"

	"github.com/google/btree"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// hold is one session's grant of a lock. value is a string, not []byte,
// so the struct takes 80 bytes, not 96 (16 MB less per million holds).
type hold struct {
	session string
	mode    int32
	token   uint64
	seq     uint64
	value   string
	granted int64
	// maxHoldMs is the hold's budget (0: none): the leader ends the hold
	// (EndHold) when it has run out on its timer.
	maxHoldMs int64
	// ask is the first RequestRelease of the hold (nil: never asked).
	ask *holdAsk
}

// holdAsk is a hold's first release request: when (the proposer's clock,
// display only), why, and the revoke grace an admin's request set (0:
// none; a later admin request sets it on a hold asked before) and when
// that request was made (graceAt, display only).
type holdAsk struct {
	at      int64
	reason  string
	graceMs int64
	graceAt int64
}

type wait struct {
	session string
	mode    int32
	seq     uint64
	value   string // as hold's
	queued  int64
	// maxHoldMs is the budget its grant will have, fixed when it queued.
	maxHoldMs int64
	// group is the AcquireMany request it is one lock of (nil: a single
	// acquire); setSize is that request's lock count (snapshots).
	group   *group
	setSize uint32
}

// lock is one named lock. Its fields are ordered by size, so it takes 96
// bytes (a million locks: 16 MB less than in declaration order, which
// padded it to 112).
type lock struct {
	name    string
	holders []*hold // in token order
	queue   []*wait // FIFO
	mark    *mark   // completion mark: then no holders or waiters
	delayMs int64   // lock-delay after an expired holder, fixed at creation
	// delayToken is the token of the expired hold that started the delay;
	// Undelay must name it, so an old timer cannot end a newer delay.
	delayToken uint64
	limit      uint32
	delayed    bool // a lock-delay runs: nothing is granted
}

// empty reports whether the lock can be deleted.
func (l *lock) empty() bool {
	return len(l.holders) == 0 && len(l.queue) == 0 && l.mark == nil && !l.delayed
}

func (l *lock) grantable(mode int32) bool {
	if mode == ModeExclusive {
		return len(l.holders) == 0
	}
	if len(l.holders) > 0 && l.holders[0].mode == ModeExclusive {
		return false
	}
	return l.limit == 0 || uint32(len(l.holders)) < l.limit
}

func validMode(m int32) bool { return m == ModeExclusive || m == ModeShared }

// addLock and deleteLock are the only ways a lock enters or leaves the
// table, so the counts the caps read and the name index stay exact.
func (f *FSM) addLock(l *lock) {
	f.locks[l.name] = l
	f.names.ReplaceOrInsert(l)
	f.counts.add(l)
}

func (f *FSM) deleteLock(l *lock) {
	delete(f.locks, l.name)
	f.names.Delete(l)
	f.counts.remove(l)
}

// namesDegree is the B-tree's degree: nodes of up to 63 names, a few cache
// lines of pointers, so a lookup touches about log64(N) nodes. A variable
// only so that tests can use tiny nodes (SetNamesDegree), which split and
// merge after a few commands.
var namesDegree = 32

// newNames returns an empty index of locks ordered by name. The map finds a
// lock by name; the index serves what needs name order (a page of
// ListLocks, a watch's state dump, a snapshot) in O(log N + what it
// returns) instead of walking and sorting the whole table under the read
// lock that Apply waits for.
func newNames() *btree.BTreeG[*lock] {
	return btree.NewG(namesDegree, func(a, b *lock) bool { return a.name < b.name })
}

// ascendFrom calls fn with each lock whose name is at least from, in name
// order, until fn returns false.
func (f *FSM) ascendFrom(from string, fn func(*lock) bool) {
	f.names.AscendGreaterOrEqual(&lock{name: from}, fn)
}

func (f *FSM) applyAcquire(c *fsmv1.Acquire) *Result {
	if r := f.liveAcquire(c); r != nil {
		return r
	}
	fp := acquireFingerprint(c)
	s, r := f.request(c.SessionId, c.Seq, c.Ack, fp, cancelledAcquireFingerprint(c.Name))
	if r != nil {
		if l := f.locks[c.Name]; r.Duplicate && l != nil {
			// The duplicate table keeps codes, not details: name the
			// current holders or mark, as the first answer did.
			switch {
			case r.Code == CodeBusy:
				r.Holders = f.holderInfos(l)
			case r.Code == CodeAlreadyDone && l.mark != nil:
				r.Mark = l.mark.view()
			}
		}
		return r
	}
	refuse := func(r *Result) *Result { return f.remember(s, c.Seq, fp, r) }
	if err := ValidateAcquire(c); err != nil {
		return refuse(fail(CodeInvalid, "%v", err))
	}
	if s.revoked {
		return refuse(fail(CodeRevoked, "session %s was force-released", s.id))
	}
	if s.holds[c.Name] != nil {
		return refuse(fail(CodeAlreadyHeld, "session already holds %q", c.Name))
	}
	if s.waits[c.Name] != nil {
		return refuse(fail(CodeAlreadyHeld, "session already waits for %q", c.Name))
	}
	if f.used(s) >= limits.locksPerSession {
		return refuse(fail(CodeTooMany, "session holds, waits for or marked done %d locks already", limits.locksPerSession))
	}
	l := f.locks[c.Name]
	if l == nil {
		limit := uint32(1)
		if c.Limit != nil {
			limit = *c.Limit
		}
		if c.LockDelayMs > 0 && f.counts.delayLocks >= limits.delayLocks {
			return refuse(fail(CodeTooMany, "%d locks with a lock-delay exist already", limits.delayLocks))
		}
		l = &lock{name: c.Name, limit: limit, delayMs: c.LockDelayMs}
	} else if c.Limit != nil && *c.Limit != l.limit {
		return refuse(fail(CodeLimitMismatch, "lock %q has limit %d, request asked %d", c.Name, l.limit, *c.Limit))
	}
	if l.mark != nil {
		r := fail(CodeAlreadyDone, "the job of lock %q is done (token %d)", c.Name, l.mark.token)
		r.Mark = l.mark.view()
		return refuse(r)
	}
	if !l.delayed && len(l.queue) == 0 && l.grantable(c.Mode) {
		if f.locks[c.Name] == nil {
			f.addLock(l)
		}
		h := f.grant(l, s, c.Mode, c.Seq, string(c.Value), c.TimeUnixNano, f.budgetOf(c))
		return f.remember(s, c.Seq, fp, &Result{Status: StatusGranted, Token: h.token, MaxHold: ms(h.maxHoldMs)})
	}
	if !c.Wait {
		r := fail(CodeBusy, "lock %q is busy", c.Name)
		r.Holders = f.holderInfos(l)
		switch {
		case l.delayed:
			r.Msg = fmt.Sprintf("lock %q is busy (lock-delay after an expired holder)", c.Name)
		case len(l.holders) == 0:
			r.Msg = fmt.Sprintf("lock %q is busy (waiters queued)", c.Name)
		}
		return refuse(r)
	}
	if len(l.queue) >= limits.waiters {
		return refuse(fail(CodeTooMany, "lock %q has %d waiters already", c.Name, limits.waiters))
	}
	if c.RefuseDeadlock {
		if r := f.deadlock(s, blockersOf(l, s.id, len(l.queue)), l); r != nil {
			return refuse(r)
		}
	}
	if f.locks[c.Name] == nil {
		f.addLock(l)
	}
	w := &wait{session: s.id, mode: c.Mode, seq: c.Seq, value: string(c.Value), queued: c.TimeUnixNano, maxHoldMs: f.budgetOf(c)}
	l.queue = append(l.queue, w)
	s.waits[c.Name] = w
	if e := f.event(EventQueued, l, s.id, 0, c.Mode, c.Value); e != nil {
		e.Seq = c.Seq
	}
	return f.remember(s, c.Seq, fp, &Result{Status: StatusQueued, Position: uint32(len(l.queue))})
}

// liveAcquire answers a repeated acquire whose answer the duplicate table
// has already dropped (a long wait outlives the table's later requests of
// its session) from the state: its wait is still queued, or it was granted.
// Without it, the repeat would be refused while its wait stays live, and a
// grant would later go to a caller that was told it failed. The repeat must
// ask what the wait or hold was made for (lock, mode, limit).
func (f *FSM) liveAcquire(c *fsmv1.Acquire) *Result {
	s := f.sessions[c.SessionId]
	if s == nil || c.Seq == 0 || c.Seq >= s.ack {
		return nil
	}
	if _, ok := s.results[c.Seq]; ok {
		return nil
	}
	l := f.locks[c.Name]
	if l == nil || c.Limit != nil && *c.Limit != l.limit {
		return nil
	}
	if w := s.waits[c.Name]; w != nil && w.seq == c.Seq && w.mode == c.Mode && w.group == nil {
		return &Result{Status: StatusQueued, Position: uint32(slices.Index(l.queue, w) + 1), Duplicate: true}
	}
	if h := s.holds[c.Name]; h != nil && h.seq == c.Seq && h.mode == c.Mode {
		return &Result{Status: StatusGranted, Token: h.token, MaxHold: ms(h.maxHoldMs), Duplicate: true}
	}
	return nil
}

func (f *FSM) grant(l *lock, s *session, mode int32, seq uint64, value string, now, maxHoldMs int64) *hold {
	f.lastToken++
	f.stats.Grants++
	h := &hold{session: s.id, mode: mode, token: f.lastToken, seq: seq, value: value, granted: now, maxHoldMs: maxHoldMs}
	l.holders = append(l.holders, h)
	s.holds[l.name] = h
	if e := f.event(EventGranted, l, s.id, h.token, mode, valueBytes(value)); e != nil {
		e.Seq, e.DurationMs = seq, maxHoldMs
	}
	return h
}

// promote grants queued waiters from the head while they fit: several shared
// waiters together, an exclusive one alone. A waiting exclusive request stops
// shared ones behind it; so does an AcquireMany request (a group) that
// cannot take every one of its locks yet. A group granted moves the queues
// of its other locks: they are promoted next, in the order the grants
// reached them (many.go). A lock left empty is deleted.
func (f *FSM) promote(l *lock, now int64) {
	work := []*lock{l}
	for len(work) > 0 {
		l := work[0]
		work = work[1:]
		if f.locks[l.name] != l {
			continue // emptied and deleted earlier in this promotion
		}
		for !l.delayed && len(l.queue) > 0 {
			w := l.queue[0]
			if w.group != nil {
				if !groupGrantable(f.locks, w.group) {
					break
				}
				work = append(work, f.grantGroup(w.group, l, now)...)
				continue
			}
			if !l.grantable(w.mode) {
				break
			}
			l.queue[0] = nil
			l.queue = l.queue[1:]
			s := f.sessions[w.session]
			delete(s.waits, l.name)
			f.grant(l, s, w.mode, w.seq, w.value, now, w.maxHoldMs)
			f.stats.QueueGrants++
		}
		if len(l.queue) == 0 {
			l.queue = nil // let the backing array go
		}
		if l.empty() {
			f.deleteLock(l)
		}
	}
}

// removeHold ends hold h of l; kind says how. It returns the event (see
// event).
func (f *FSM) removeHold(l *lock, h *hold, kind EventKind) *Event {
	l.holders = slices.DeleteFunc(l.holders, func(x *hold) bool { return x == h })
	delete(f.sessions[h.session].holds, l.name)
	return f.event(kind, l, h.session, h.token, h.mode, nil)
}

func (f *FSM) removeWait(l *lock, w *wait) {
	l.queue = slices.DeleteFunc(l.queue, func(x *wait) bool { return x == w })
	delete(f.sessions[w.session].waits, l.name)
	f.dequeued(l, w)
}

// dequeued records that w left l's queue without a grant.
func (f *FSM) dequeued(l *lock, w *wait) {
	if e := f.event(EventDequeued, l, w.session, 0, w.mode, nil); e != nil {
		e.Seq = w.seq
	}
}

func (f *FSM) applyRelease(c *fsmv1.Release) *Result {
	fp := releaseFingerprint(c)
	s, r := f.request(c.SessionId, c.Seq, c.Ack, fp, 0)
	if r != nil {
		return r
	}
	h := s.holds[c.Name]
	if h == nil || h.token != c.Token {
		return f.remember(s, c.Seq, fp, fail(CodeNotHeld, "lock %q is not held with token %d by this session", c.Name, c.Token))
	}
	l := f.locks[c.Name]
	f.removeHold(l, h, EventReleased)
	f.promote(l, c.TimeUnixNano)
	return f.remember(s, c.Seq, fp, &Result{GrantedAt: time.Unix(0, h.granted)})
}

// waitFacts adds to the answer r of acquire c, unless granted, whether a
// lock-delay runs on its lock and when its request was queued, if it waits;
// to a repeated grant, its hold's budget.
func (f *FSM) waitFacts(c *fsmv1.Acquire, r *Result) *Result {
	l := f.locks[c.Name]
	if r.Status == StatusGranted && r.Duplicate && l != nil {
		// The duplicate table keeps the token, not the budget: read it
		// from the hold while that grant still holds.
		if s := f.sessions[c.SessionId]; s != nil {
			if h := s.holds[c.Name]; h != nil && h.token == r.Token {
				r.MaxHold = ms(h.maxHoldMs)
			}
		}
	}
	if r.Status == StatusGranted || l == nil {
		return r
	}
	r.Delayed = l.delayed
	if s := f.sessions[c.SessionId]; s != nil {
		if w := s.waits[c.Name]; w != nil && w.seq == c.Seq {
			r.QueuedAt = time.Unix(0, w.queued)
		}
	}
	return r
}

func (f *FSM) applyCancel(c *fsmv1.Cancel) *Result {
	fp := cancelFingerprint(c)
	s, r := f.request(c.SessionId, c.Seq, c.Ack, fp, 0)
	if r != nil {
		return r
	}
	l := f.locks[c.Name]
	if w := s.waits[c.Name]; w != nil && w.seq == c.AcquireSeq && w.group != nil {
		f.dropGroup(w.group, c.TimeUnixNano) // the whole AcquireMany request
		return f.remember(s, c.Seq, fp, &Result{})
	}
	if w := s.waits[c.Name]; w != nil && w.seq == c.AcquireSeq {
		f.removeWait(l, w)
		f.promote(l, c.TimeUnixNano)
		return f.remember(s, c.Seq, fp, &Result{})
	}
	if h := s.holds[c.Name]; h != nil && h.seq == c.AcquireSeq {
		f.removeHold(l, h, EventReleased)
		f.promote(l, c.TimeUnixNano)
		return f.remember(s, c.Seq, fp, &Result{Released: true})
	}
	if _, answered := s.results[c.AcquireSeq]; !answered && c.AcquireSeq >= s.ack && c.AcquireSeq < c.Seq {
		// The cancel overtook its acquire (still in flight, say through a
		// follower): answer that acquire now, so when it lands it is refused
		// from the duplicate table instead of queuing or taking the lock for
		// a caller that gave up. It takes a place in the table like any
		// answer; if the table evicts it, the floor rises past it and the
		// late acquire is refused as too old, just as safe.
		f.remember(s, c.AcquireSeq, cancelledAcquireFingerprint(c.Name), fail(CodeCancelled, "cancelled"))
	}
	return f.remember(s, c.Seq, fp, &Result{})
}
