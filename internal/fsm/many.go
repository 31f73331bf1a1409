package fsm

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// AcquireMany: a set of locks taken all at once in one entry, or one
// request queued on every lock of the set (a group: one wait per lock, all
// sharing session and seq), granted only when it can take every lock at
// once. Never part of the set.
//
// FIFO with sets. A group member at the head of a lock's queue blocks the
// waiters behind it on that lock, as an exclusive waiter blocks shared ones:
// nothing queued later on that lock is granted first. The group is granted
// when it is at the head of every one of its queues and fits every lock (no
// lock-delay running). Every request is appended to all its queues in one
// entry, so all queues order their requests by log position: the oldest
// waiting request anywhere is at the head of each of its queues, and waits
// only for holders. So neither sets nor single waiters starve while holders
// release, and waiters alone never deadlock each other.

// MaxManyLocks bounds the locks of one AcquireMany.
const MaxManyLocks = 32

// group is one queued AcquireMany: its waits, by lock name.
type group struct {
	session string
	seq     uint64
	names   []string // sorted
	waits   []*wait  // waits[i] waits for names[i]
}

// ValidateAcquireMany reports why Apply refuses c for its fields alone: 2
// to MaxManyLocks distinct valid names, valid modes, the budget's and
// ceiling's ranges and the value's size.
func ValidateAcquireMany(c *fsmv1.AcquireMany) error {
	if n := len(c.Locks); n < 2 || n > MaxManyLocks {
		return fmt.Errorf("%d locks: an AcquireMany takes 2 to %d", n, MaxManyLocks)
	}
	seen := map[string]bool{}
	for _, l := range c.Locks {
		if err := ValidateName(l.Name); err != nil {
			return err
		}
		if seen[l.Name] {
			return fmt.Errorf("lock %q named twice", l.Name)
		}
		seen[l.Name] = true
		if !validMode(l.Mode) {
			return fmt.Errorf("lock %q: unknown mode %d", l.Name, l.Mode)
		}
	}
	if err := checkHoldMs("max hold", c.MaxHoldMs); err != nil {
		return err
	}
	if err := checkHoldMs("max hold ceiling", c.MaxHoldCeilingMs); err != nil {
		return err
	}
	return validateValue(c.Value)
}

// sortedLocks returns c's locks by name.
func sortedLocks(c *fsmv1.AcquireMany) []*fsmv1.ManyLock {
	ls := slices.Clone(c.Locks)
	slices.SortFunc(ls, func(a, b *fsmv1.ManyLock) int { return strings.Compare(a.Name, b.Name) })
	return ls
}

func manyFingerprint(c *fsmv1.AcquireMany) fingerprint {
	var nums []uint64
	var names strings.Builder
	for _, l := range sortedLocks(c) {
		names.WriteString(l.Name)
		names.WriteByte(0)
		limit := uint64(1) << 32
		if l.Limit != nil {
			limit = uint64(*l.Limit)
		}
		nums = append(nums, uint64(uint32(l.Mode)), limit)
	}
	return fingerprintOf(byte(CmdAcquireMany), names.String(), nums...)
}

// budgetOfMany is the one budget of every hold of set c: the request's,
// else the shortest policy default among its locks, capped by the ceiling.
func (f *FSM) budgetOfMany(c *fsmv1.AcquireMany) int64 {
	b := c.MaxHoldMs
	if b == 0 {
		for _, l := range c.Locks {
			if p := f.policies[l.Name]; p != nil && p.defaultMaxHoldMs > 0 && (b == 0 || p.defaultMaxHoldMs < b) {
				b = p.defaultMaxHoldMs
			}
		}
	}
	if ceil := c.MaxHoldCeilingMs; ceil > 0 && (b == 0 || ceil < b) {
		b = ceil
	}
	return b
}

// liveMany answers, as liveAcquire does for one lock, a repeated
// AcquireMany whose answer the duplicate table has dropped, from the state:
// every lock held by its seq (granted), or its group still queued.
func (f *FSM) liveMany(c *fsmv1.AcquireMany) *Result {
	s := f.sessions[c.SessionId]
	if s == nil || c.Seq == 0 || c.Seq >= s.ack || ValidateAcquireMany(c) != nil {
		return nil
	}
	if _, ok := s.results[c.Seq]; ok {
		return nil
	}
	ls := sortedLocks(c)
	if tokens := heldBySeq(s, ls, c.Seq); tokens != nil {
		return &Result{Status: StatusGranted, Token: tokens[0], Tokens: tokens, MaxHold: ms(s.holds[ls[0].Name].maxHoldMs), Duplicate: true}
	}
	if w := s.waits[ls[0].Name]; w != nil && w.seq == c.Seq && w.group != nil && len(w.group.names) == len(ls) && queuedBySeq(s, ls, w.group) {
		l := f.locks[ls[0].Name]
		return &Result{Status: StatusQueued, Position: uint32(slices.Index(l.queue, w) + 1), Duplicate: true}
	}
	return nil
}

// queuedBySeq reports whether every lock of ls has a wait of s in group g,
// in the mode ls asks: the repeat asks what the set was queued for.
func queuedBySeq(s *session, ls []*fsmv1.ManyLock, g *group) bool {
	for _, ml := range ls {
		if w := s.waits[ml.Name]; w == nil || w.group != g || w.mode != ml.Mode {
			return false
		}
	}
	return true
}

// heldBySeq returns the tokens of s's holds of every lock of ls made by
// the request seq, in ls's order; nil unless it holds them all.
func heldBySeq(s *session, ls []*fsmv1.ManyLock, seq uint64) []uint64 {
	var tokens []uint64
	for _, ml := range ls {
		h := s.holds[ml.Name]
		if h == nil || h.seq != seq || h.mode != ml.Mode {
			return nil
		}
		tokens = append(tokens, h.token)
	}
	return tokens
}

func (f *FSM) applyAcquireMany(c *fsmv1.AcquireMany) *Result {
	if r := f.liveMany(c); r != nil {
		return r
	}
	fp := manyFingerprint(c)
	s, r := f.request(c.SessionId, c.Seq, c.Ack, fp, 0)
	if r != nil {
		if r.Duplicate && r.Status == StatusGranted && ValidateAcquireMany(c) == nil {
			// The table keeps the first token only: read the others (and
			// the budget) from the holds, while the set is still held.
			ls := sortedLocks(c)
			if r.Tokens = heldBySeq(f.sessions[c.SessionId], ls, c.Seq); r.Tokens != nil {
				r.MaxHold = ms(f.sessions[c.SessionId].holds[ls[0].Name].maxHoldMs)
			}
		}
		return r
	}
	refuse := func(r *Result) *Result { return f.remember(s, c.Seq, fp, r) }
	if err := ValidateAcquireMany(c); err != nil {
		return refuse(fail(CodeInvalid, "%v", err))
	}
	if s.revoked {
		return refuse(fail(CodeRevoked, "session %s was force-released", s.id))
	}
	if f.used(s)+len(c.Locks) > limits.locksPerSession {
		return refuse(fail(CodeTooMany, "session would hold, wait for or mark more than %d locks", limits.locksPerSession))
	}
	ls := sortedLocks(c)
	locks := make([]*lock, len(ls))
	free := true
	for i, ml := range ls {
		if s.holds[ml.Name] != nil || s.waits[ml.Name] != nil {
			return refuse(fail(CodeAlreadyHeld, "session already holds or waits for %q", ml.Name))
		}
		l := f.locks[ml.Name]
		if l == nil {
			limit := uint32(1)
			if ml.Limit != nil {
				limit = *ml.Limit
			}
			l = &lock{name: ml.Name, limit: limit}
		} else if ml.Limit != nil && *ml.Limit != l.limit {
			return refuse(fail(CodeLimitMismatch, "lock %q has limit %d, request asked %d", ml.Name, l.limit, *ml.Limit))
		}
		if l.mark != nil {
			r := fail(CodeAlreadyDone, "the job of lock %q is done (token %d)", ml.Name, l.mark.token)
			r.Mark = l.mark.view()
			return refuse(r)
		}
		if l.delayed || len(l.queue) > 0 || !l.grantable(ml.Mode) {
			free = false
		}
		locks[i] = l
	}
	budget := f.budgetOfMany(c)
	if free {
		res := &Result{Status: StatusGranted, MaxHold: ms(budget)}
		for i, l := range locks {
			if f.locks[l.name] == nil {
				f.addLock(l)
			}
			h := f.grant(l, s, ls[i].Mode, c.Seq, string(c.Value), c.TimeUnixNano, budget)
			res.Tokens = append(res.Tokens, h.token)
		}
		res.Token = res.Tokens[0]
		return f.remember(s, c.Seq, fp, res)
	}
	if !c.Wait {
		for i, l := range locks {
			if l.delayed || len(l.queue) > 0 || !l.grantable(ls[i].Mode) {
				r := fail(CodeBusy, "lock %q of the set is busy", l.name)
				r.Holders = f.holderInfos(l)
				return refuse(r)
			}
		}
	}
	var edges []edge
	for _, l := range locks {
		if len(l.queue) >= limits.waiters {
			return refuse(fail(CodeTooMany, "lock %q has %d waiters already", l.name, limits.waiters))
		}
		edges = append(edges, blockersOf(l, s.id, len(l.queue))...)
	}
	if r := f.deadlock(s, edges, locks...); r != nil {
		return refuse(r)
	}
	g := &group{session: s.id, seq: c.Seq}
	for i, l := range locks {
		if f.locks[l.name] == nil {
			f.addLock(l)
		}
		w := &wait{session: s.id, mode: ls[i].Mode, seq: c.Seq, value: string(c.Value), queued: c.TimeUnixNano, maxHoldMs: budget, group: g}
		g.names, g.waits = append(g.names, l.name), append(g.waits, w)
		l.queue = append(l.queue, w)
		s.waits[l.name] = w
		if e := f.event(EventQueued, l, s.id, 0, w.mode, c.Value); e != nil {
			e.Seq = c.Seq
		}
	}
	return f.remember(s, c.Seq, fp, &Result{Status: StatusQueued, Position: uint32(len(locks[0].queue))})
}

// groupGrantable reports whether g is at the head of every one of its
// queues and fits every lock of locks.
func groupGrantable(locks map[string]*lock, g *group) bool {
	for i, name := range g.names {
		l, w := locks[name], g.waits[i]
		if l == nil || l.delayed || len(l.queue) == 0 || l.queue[0] != w || !l.grantable(w.mode) {
			return false
		}
	}
	return true
}

// grantGroup grants every lock of g (at the head of each queue), in name
// order, and returns the locks other than from, whose queues moved.
func (f *FSM) grantGroup(g *group, from *lock, now int64) []*lock {
	s := f.sessions[g.session]
	var moved []*lock
	for i, name := range g.names {
		l, w := f.locks[name], g.waits[i]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		delete(s.waits, name)
		f.grant(l, s, w.mode, w.seq, w.value, now, w.maxHoldMs)
		f.stats.QueueGrants++
		if l != from {
			moved = append(moved, l)
		}
	}
	return moved
}

// dropGroup removes every wait of g, then grants what that frees, in lock
// name order.
func (f *FSM) dropGroup(g *group, now int64) {
	for i, name := range g.names {
		f.removeWait(f.locks[name], g.waits[i])
	}
	for _, name := range g.names {
		if l := f.locks[name]; l != nil {
			f.promote(l, now)
		}
	}
}

// dropGroupsOf removes the other waits of the groups among ws (waits that
// already left lock except), then grants what that frees, in name order.
func (f *FSM) dropGroupsOf(ws []*wait, except string, now int64) {
	var names []string
	for _, w := range ws {
		if w.group == nil {
			continue
		}
		for i, name := range w.group.names {
			if name != except {
				f.removeWait(f.locks[name], w.group.waits[i])
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if l := f.locks[name]; l != nil {
			f.promote(l, now)
		}
	}
}

// decodeGroups rebuilds the groups of a snapshot's set waits (set_size > 0,
// one per lock, sharing session and seq) and checks that each is whole and
// not grantable (Apply never leaves a grantable group waiting).
func decodeGroups(sessions map[string]*session, locks map[string]*lock) error {
	type key struct {
		session string
		seq     uint64
	}
	groups := map[key]*group{}
	for _, s := range sessions {
		for name, w := range s.waits {
			if w.setSize == 0 {
				continue
			}
			k := key{s.id, w.seq}
			g := groups[k]
			if g == nil {
				g = &group{session: s.id, seq: w.seq}
				groups[k] = g
			}
			g.names, g.waits = append(g.names, name), append(g.waits, w)
			w.group = g
		}
	}
	for _, g := range groups {
		idx := make([]int, len(g.names))
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return strings.Compare(g.names[a], g.names[b]) })
		names, waits := make([]string, len(idx)), make([]*wait, len(idx))
		for i, j := range idx {
			names[i], waits[i] = g.names[j], g.waits[j]
		}
		g.names, g.waits = names, waits
		for _, w := range g.waits {
			if int(w.setSize) != len(g.names) || len(g.names) < 2 || len(g.names) > MaxManyLocks {
				return fmt.Errorf("snapshot: session %q: set request %d: %w", g.session, g.seq, errBadSet)
			}
		}
		if groupGrantable(locks, g) {
			return fmt.Errorf("snapshot: session %q: set request %d could be granted", g.session, g.seq)
		}
	}
	return nil
}

// errBadSet is a snapshot's set request whose waits do not make a whole set.
var errBadSet = errors.New("incomplete set request")

// setSize is w's set_size in a snapshot: its request's lock count, 0 for a
// single acquire.
func setSize(w *wait) uint32 {
	if w.group == nil {
		return 0
	}
	return uint32(len(w.group.names))
}

// HeldBySeq returns the tokens of the holds of names (sorted) the request
// seq of session made, in names' order, and their budget; false unless it
// holds them all.
func (f *FSM) HeldBySeq(session string, seq uint64, names []string) ([]uint64, time.Duration, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[session]
	if s == nil {
		return nil, 0, false
	}
	tokens := make([]uint64, len(names))
	for i, n := range names {
		h := s.holds[n]
		if h == nil || h.seq != seq {
			return nil, 0, false
		}
		tokens[i] = h.token
	}
	return tokens, ms(s.holds[names[0]].maxHoldMs), true
}
