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
// sessions that hold L and for those of the earlier requests queued on L
// that block it (FIFO: every earlier request unless both are single shared
// requests, since a set's wait blocks whatever queues behind it). A
// session waits for what any of its waiting requests waits for.
//
// An acquire that would queue and so close a cycle is refused with
// CodeDeadlock naming the cycle, in the same entry, instead of waiting
// forever. Every walk is in a sorted order (lock names, then queue and
// token order), so every replica finds the same cycle.

// blocks reports whether the earlier queued request q keeps w behind it.
func blocks(q, w *wait) bool {
	return q.group != nil || w.group != nil || q.mode == ModeExclusive || w.mode == ModeExclusive
}

// edge is one reason a session waits: on lock name, for session to (a
// holder, or an earlier blocking request).
type edge struct {
	name, to string
	holds    bool
}

// blockersOf returns why a request of session in mode on l (queued at
// index pos; len(l.queue) for one about to queue) waits, in holder then
// queue order. inSet marks a set's request.
func blockersOf(l *lock, session string, mode int32, pos int, inSet bool) []edge {
	var out []edge
	for _, h := range l.holders {
		if h.session != session {
			out = append(out, edge{l.name, h.session, true})
		}
	}
	w := &wait{mode: mode}
	if inSet {
		w.group = &group{}
	}
	for _, q := range l.queue[:min(pos, len(l.queue))] {
		if q.session != session && blocks(q, w) {
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
		out = append(out, blockersOf(l, s.id, w.mode, slices.Index(l.queue, w), w.group != nil)...)
	}
	return out
}

// cycleTo looks for a path from the edges first back to session target,
// depth first in edge order, and returns it (nil: none).
func (f *FSM) cycleTo(target string, first []edge) []edge {
	seen := map[string]bool{}
	var path []edge
	var walk func(es []edge) bool
	walk = func(es []edge) bool {
		for _, e := range es {
			path = append(path, e)
			if e.to == target {
				return true
			}
			if !seen[e.to] {
				seen[e.to] = true
				if s := f.sessions[e.to]; s != nil && walk(f.waitsOf(s)) {
					return true
				}
			}
			path = path[:len(path)-1]
		}
		return false
	}
	if walk(first) {
		return path
	}
	return nil
}

// deadlock returns the refusal of a request of session s that would wait
// for the edges first, when one of them leads back to s; nil otherwise.
func (f *FSM) deadlock(s *session, first []edge) *Result {
	path := f.cycleTo(s.id, first)
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
