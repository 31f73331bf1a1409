package node

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/lockd-dev/lockd/internal/fsm"
)

// The watch history: a bounded ring of the node's most recent lock events,
// filled from Apply (through the FSM's event sink, Fanout), read by every watch
// stream with its own cursor. One copy of each event per node; a stream
// owns only its cursor and a batch of at most Config.WatchBuffer events, so
// a stalled consumer costs no memory beyond that: when its cursor leaves the
// ring it gets a reset instead.

// Pos is a watch position: the Raft log index of an entry and the 1-based
// number of an event among that entry's events. (index, 0) is the point
// just before the entry's first event.
type Pos struct {
	Index uint64
	Num   uint32
}

// Less orders positions: by entry, then by event within the entry.
func (p Pos) Less(q Pos) bool {
	return p.Index < q.Index || p.Index == q.Index && p.Num < q.Num
}

// String is the position without its cluster tag: "INDEX.N". Clients see
// it with the tag (Server.wirePos).
func (p Pos) String() string {
	return strconv.FormatUint(p.Index, 10) + "." + strconv.FormatUint(uint64(p.Num), 10)
}

// EventPos is the position of event e.
func EventPos(e *fsm.Event) Pos { return Pos{e.Index, e.Num} }

// posTagLen is how many hex digits of the cluster id a position carries
// after its "@": 64 random bits tell one cluster's history from another's.
// Every history has its own cluster id (a bootstrap and a restore from a
// backup each draw a new one), so the tag ties a position to the one log it
// counts entries of.
const posTagLen = 16

// ClusterTag is the tag of positions in the cluster whose id is id ("" while
// the node knows no cluster id).
func ClusterTag(id string) string {
	if len(id) > posTagLen {
		return id[:posTagLen]
	}
	return id
}

// ResetFrom is the "from" (or SSE Last-Event-ID) that asks for a reset at
// once: the id of an SSE reset that a state dump follows, so a browser that
// reconnects during the dump is sent the reset and the whole state again.
const ResetFrom = "reset"

// ErrBadPosition is a from that is not a position.
var ErrBadPosition = errors.New("position must be INDEX.N@CLUSTER, as a watch event gives it")

// ParsePos parses a position as clients see it, "INDEX.N@TAG", or one
// without a tag ("INDEX.N", as servers before the tag gave them).
func ParsePos(s string) (Pos, error) {
	p, _, err := ParseTaggedPos(s)
	return p, err
}

// ParseTaggedPos parses a position and returns its cluster tag ("" when it
// has none).
func ParseTaggedPos(s string) (Pos, string, error) {
	s, tag, tagged := strings.Cut(s, "@")
	if tagged && (tag == "" || len(tag) > 2*posTagLen || strings.Trim(tag, "0123456789abcdef") != "") {
		return Pos{}, "", fmt.Errorf("%q: %w", s+"@"+tag, ErrBadPosition)
	}
	a, b, ok := strings.Cut(s, ".")
	if !ok {
		return Pos{}, "", fmt.Errorf("%q: %w", s, ErrBadPosition)
	}
	i, err1 := strconv.ParseUint(a, 10, 64)
	n, err2 := strconv.ParseUint(b, 10, 32)
	if err1 != nil || err2 != nil {
		return Pos{}, "", fmt.Errorf("%q: %w", s, ErrBadPosition)
	}
	return Pos{i, uint32(n)}, tag, nil
}

// maxScan bounds the events one read looks at, so a stream with a narrow
// prefix holds the Hub's lock for a bounded time.
const maxScan = 4096

// Hub is the node's watch history.
type Hub struct {
	mu    sync.Mutex
	ring  []fsm.Event // circular: n events from start
	start int
	n     int
	// floor: every event after it is in the ring or still to come; a cursor
	// below it has missed events and gets a reset.
	floor Pos
	// head is the newest event's position (or floor, when newer).
	head Pos
	// restoring: the state was replaced and the floor is not known until
	// the next entry (fsm.EventSink.Reset(0)); readers wait.
	restoring bool
	wake      chan struct{} // closed and replaced when something changes
	waiting   bool          // someone holds wake
}

// NewHub returns a history that keeps the latest size events.
func NewHub(size int) *Hub {
	return &Hub{ring: make([]fsm.Event, size), wake: make(chan struct{})}
}

// signal wakes the readers; h.mu is held.
func (h *Hub) signal() {
	if h.waiting {
		close(h.wake)
		h.wake, h.waiting = make(chan struct{}), false
	}
}

// Events appends an entry's lock events (those fsm.EventKind.Watched
// reports), evicting the oldest. It never blocks (Apply calls it, through
// the node's Fanout).
func (h *Hub) Events(_ uint64, evs []fsm.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	stored := false
	for i := range evs {
		if !evs[i].Kind.Watched() {
			continue
		}
		stored = true
		if h.n == len(h.ring) {
			h.floor = EventPos(&h.ring[h.start])
			h.ring[h.start] = fsm.Event{}
			h.start = (h.start + 1) % len(h.ring)
			h.n--
		}
		h.ring[(h.start+h.n)%len(h.ring)] = evs[i]
		h.n++
		h.head = EventPos(&evs[i])
	}
	if stored {
		h.signal()
	}
}

// Reset follows fsm.EventSink's Reset: the state was replaced, so the history
// no longer leads to it. Every cursor below the new floor gets a reset.
func (h *Hub) Reset(from uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.ring)
	h.start, h.n = 0, 0
	if from == 0 {
		h.restoring = true
		h.floor = Pos{math.MaxUint64, 0}
	} else {
		h.restoring = false
		h.floor = Pos{from, 0}
		h.head = h.floor
	}
	h.signal()
}

// Now is the position a new stream without from starts at.
func (h *Hub) Now() Pos {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.head.Less(h.floor) && !h.restoring {
		return h.floor
	}
	return h.head
}

// Stored is how many events the ring holds, for tests and metrics.
func (h *Hub) Stored() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// ReadResult is what one read found.
type ReadResult struct {
	Events []fsm.Event // events after the cursor matching the prefix, whole entries
	Next   Pos         // the cursor after them (past filtered events too)
	Reset  bool        // the cursor is below the floor: reset to next
	Wait   <-chan struct{}
}

// Read copies into buf (up to its capacity) the events after cursor whose
// lock names start with prefix. When there are none yet, wait is closed when
// there may be.
func (h *Hub) Read(cursor Pos, prefix string, buf []fsm.Event) ReadResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.restoring {
		h.waiting = true
		return ReadResult{Next: cursor, Wait: h.wake}
	}
	if cursor.Less(h.floor) {
		next := h.head
		if next.Less(h.floor) {
			next = h.floor
		}
		return ReadResult{Next: next, Reset: true}
	}
	// First event after cursor: positions in the ring ascend.
	lo, hi := 0, h.n
	for lo < hi {
		mid := (lo + hi) / 2
		if cursor.Less(EventPos(&h.ring[(h.start+mid)%len(h.ring)])) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	out := ReadResult{Events: buf[:0], Next: cursor}
	for i := lo; i < h.n; i++ {
		e := &h.ring[(h.start+i)%len(h.ring)]
		// Whole entries only (an entry is published at once, so it is
		// whole in the ring): the batch may pass its size by the rest of
		// one entry, which Apply bounds (a session's locks at most).
		if e.Index != out.Next.Index && (i-lo >= maxScan || len(out.Events) >= cap(buf)) {
			break
		}
		out.Next = EventPos(e)
		if strings.HasPrefix(e.Name, prefix) {
			out.Events = append(out.Events, *e)
		}
	}
	if out.Next == cursor {
		h.waiting = true
		out.Wait = h.wake
	}
	return out
}
