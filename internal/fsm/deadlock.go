package fsm

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Deadlock detection. The waits-for graph over sessions is computed on
// demand from the lock table (never stored, so nothing to snapshot or keep
// in step): a waiting request of session S on lock L waits for the
// sessions that hold L and for those of every earlier request queued on L.
// A session waits for what any of its waiting requests waits for.
//
// For a semaphore or a shared request this is more than "blocked now": a
// request needs one free slot, not every holder gone, and a shared request
// queued behind another shared one is not held back by it. The graph
// counts them all on purpose: a request queued before S is granted before
// S (FIFO) and then holds the lock S waits for, so the edge S would get at
// that grant exists from the start. Every edge therefore appears when a
// request queues, never at a grant, and refusing at queue time every
// request that closes a cycle leaves no cycle at all: none can form later.
// The price is a refusal where slots might have freed in time (documented
// in docs/lock-semantics.md).
//
// An acquire that would queue and so close a cycle is refused with
// CodeDeadlock naming the cycle, in the same entry, instead of waiting
// forever. Every walk is in a sorted order (lock names, then queue and
// token order), so every replica finds the same cycle.

// edge is one reason a session waits: on lock name, for session to (a
// holder, or an earlier blocking request).
type edge struct {
	name, to string
	holds    bool
}

// blockersOf returns why a request of session on l (queued at index pos;
// len(l.queue) for one about to queue) waits, in holder then queue order.
func blockersOf(l *lock, session string, pos int) []edge {
	var out []edge
	for _, h := range l.holders {
		if h.session != session {
			out = append(out, edge{l.name, h.session, true})
		}
	}
	for _, q := range l.queue[:min(pos, len(l.queue))] {
		if q.session != session {
			out = append(out, edge{l.name, q.session, false})
		}
	}
	return out
}

// waitsOf returns the edges out of session s: for each lock it waits for,
// by name, why.
func (f *FSM) waitsOf(s *session) []edge {
	var out []edge
	for _, name := range sortedKeys(s.waits) {
		l, w := f.locks[name], s.waits[name]
		out = append(out, blockersOf(l, s.id, slices.Index(l.queue, w))...)
	}
	return out
}

// cycleTo looks for a path from the edges first back to session target
// and returns it (nil: none). The walk is breadth first: sessions in the
// order they are reached, each session's waits in lock-name order, each
// lock's holders then queue in order, so every replica finds the same
// path, a shortest one.
//
// It runs inside Apply, so its cost is bounded by the part of the lock
// table it touches, not by the square of a queue: every session is
// expanded once, and every lock keeps how far its queue has been read
// (lockWalk). A waiter at position p waits for the queue's first p
// requests (those that block it); a later waiter's prefix includes an
// earlier one's, so only the part not read yet is read. A waiter's
// position comes from one pass over its lock's queue, made the first time
// the walk meets that lock. With one lock and n waiters this is O(n) per
// queued acquire; a walk that expanded each waiter's prefix afresh was
// O(n²), and queueing n waiters O(n³): 10 000 waiters took minutes.
func (f *FSM) cycleTo(target string, first []edge, seeds []*lock) []edge {
	type reach struct {
		from string // the session whose wait the edge leaves (target: first)
		e    edge
	}
	parent := map[string]reach{}
	walks := make(map[string]*lockWalk, len(seeds))
	var order []string // sessions reached, in order
	var found []edge
	visit := func(from string, e edge) bool {
		if e.to == target {
			path := []edge{e}
			for from != target {
				r := parent[from]
				path = append(path, r.e)
				from = r.from
			}
			slices.Reverse(path)
			found = path
			return true
		}
		if _, ok := parent[e.to]; !ok && !f.leaf(walks, e) {
			parent[e.to] = reach{from, e}
			order = append(order, e.to)
		}
		return false
	}
	// The new request's own locks were read whole into first.
	for _, l := range seeds {
		walks[l.name] = &lockWalk{holders: true, read: len(l.queue)}
	}
	for _, e := range first {
		if visit(target, e) {
			return found
		}
	}
	for i := 0; i < len(order); i++ {
		s := f.sessions[order[i]]
		if s == nil {
			continue
		}
		for _, name := range waitNames(s) {
			l, w := f.locks[name], s.waits[name]
			lw := walks[name]
			if lw == nil {
				lw = &lockWalk{}
				walks[name] = lw
			}
			stop := false
			lw.blockers(l, s.id, w, func(e edge) bool {
				stop = visit(s.id, e)
				return !stop
			})
			if stop {
				return found
			}
		}
	}
	return nil
}

// lockWalk is how far cycleTo has read one lock: its holders, and the
// prefix of its queue (read). The locks of the request being checked (the
// seeds) were read whole into cycleTo's first edges. pos is each queued
// request's position, made when first needed.
type lockWalk struct {
	pos     map[*wait]int
	holders bool
	read    int
}

// done reports whether every edge of every wait on l was read already.
func (lw *lockWalk) done(l *lock) bool {
	return lw.holders && lw.read >= len(l.queue)
}

// leaf reports whether the session e reaches can lead nowhere new: it
// waits for nothing, or only on a lock whose every edge was read.
func (f *FSM) leaf(walks map[string]*lockWalk, e edge) bool {
	s := f.sessions[e.to]
	if s == nil || len(s.waits) == 0 {
		return true
	}
	if len(s.waits) > 1 {
		return false
	}
	for name := range s.waits {
		lw := walks[name]
		return lw != nil && lw.done(f.locks[name])
	}
	return false
}

// waitNames returns the names of the locks s waits on, sorted.
func waitNames(s *session) []string {
	if len(s.waits) == 1 {
		for name := range s.waits {
			return []string{name}
		}
	}
	return sortedKeys(s.waits)
}

// blockers yields the edges of session's wait w on l not yielded before in
// this walk, holders first, until yield returns false.
func (lw *lockWalk) blockers(l *lock, session string, w *wait, yield func(edge) bool) {
	if !lw.holders {
		lw.holders = true
		for _, h := range l.holders {
			if h.session != session && !yield(edge{l.name, h.session, true}) {
				return
			}
		}
	}
	if lw.done(l) {
		return
	}
	if lw.pos == nil {
		lw.pos = make(map[*wait]int, len(l.queue))
		for i, q := range l.queue {
			lw.pos[q] = i
		}
	}
	p, ok := lw.pos[w]
	if !ok {
		return
	}
	for ; lw.read < p; lw.read++ {
		if q := l.queue[lw.read]; q.session != session && !yield(edge{l.name, q.session, false}) {
			lw.read++
			return
		}
	}
}

// deadlock returns the refusal of a request of session s that would wait
// for the edges first, when one of them leads back to s; nil otherwise.
func (f *FSM) deadlock(s *session, first []edge, seeds ...*lock) *Result {
	path := f.cycleTo(s.id, first, seeds)
	if path == nil {
		return nil
	}
	var b strings.Builder
	from := s.id
	for i, e := range path {
		if i > 0 {
			b.WriteString(", ")
		}
		why := "queued before it on"
		if e.holds {
			why = "holding"
		}
		fmt.Fprintf(&b, "session %s waits for %q (session %s %s it)", from, e.name, e.to, why)
		from = e.to
	}
	return fail(CodeDeadlock, "deadlock: %s", b.String())
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// WaitStep is one link of Explain's chain: Session waits for Lock, which
// BlockedBy holds (Holding) or is queued before it on.
type WaitStep struct {
	// Depth is 1 for a holder of the lock explained, then one more per
	// link.
	Depth int
	// Session and Owner are the waiting session.
	Session, Owner string
	// Lock is the lock it waits for, QueuedAt since when.
	Lock     string
	QueuedAt time.Time
	// BlockedBy and BlockedByOwner are what it waits for.
	BlockedBy, BlockedByOwner string
	// Holding reports that BlockedBy holds Lock (else it is queued before).
	Holding bool
	// Cycle reports that BlockedBy appears earlier in the chain.
	Cycle bool
}

// maxExplainSteps bounds Explain's chain.
const maxExplainSteps = 1000

// Explain returns the lock named name (false when it does not exist) and
// the chain of what each of its holders waits for, depth first across
// locks, each session followed once; truncated when cut at 1000 steps.
func (f *FSM) Explain(name string) (info LockInfo, chain []WaitStep, truncated, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	l := f.locks[name]
	if l == nil {
		return LockInfo{}, nil, false, false
	}
	seen := map[string]bool{}
	var walk func(s *session, depth int)
	walk = func(s *session, depth int) {
		for _, e := range f.waitsOf(s) {
			if len(chain) >= maxExplainSteps {
				truncated = true
				return
			}
			chain = append(chain, WaitStep{Depth: depth, Session: s.id, Owner: s.owner, Lock: e.name, QueuedAt: time.Unix(0, s.waits[e.name].queued),
				BlockedBy: e.to, BlockedByOwner: f.ownerOf(e.to), Holding: e.holds, Cycle: seen[e.to]})
			if !seen[e.to] {
				seen[e.to] = true
				if next := f.sessions[e.to]; next != nil {
					walk(next, depth+1)
				}
			}
		}
	}
	for _, h := range l.holders {
		if !seen[h.session] {
			seen[h.session] = true
			walk(f.sessions[h.session], 1)
		}
	}
	return f.lockInfo(l), chain, truncated, true
}
