package node

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// A restarting node reads the log written after its snapshot twice:
// raft.NewRaft reads every entry for configuration changes, and the node
// reads each again to apply it once the entries are known committed. With
// 1 000 000 locks that log may be some 10 MB and 70 000 entries (a
// snapshot is taken when the log reaches an eighth of the last one), one
// pread each, and 0.4 s of each pass. So the entries the first pass reads
// are kept, up to about replayCacheBytes, and the apply's read of each is
// served from memory and drops it. Other reads of a kept entry (a new
// leader reads its last entry to replicate it) are served and keep it.
// What the apply never reads goes when a delete covers it, a minute after
// the start, or when the node closes (node.go).
//
// A read served from the cache is what a read from the log would give:
// the cache fills only while NewRaft runs (which reads the log first, but
// also starts Raft's goroutines before it returns, so entries may be
// stored or deleted while it fills); the log changes only through
// StoreLogs and DeleteRange (raft-wal never rewrites an entry in place: a
// follower's conflicting tail is deleted first); and either one, before
// it changes the log, ends the filling for good and drops every kept
// entry it could touch. A read of the old entry that is kept after that
// is refused, as the filling has ended; one kept before it is dropped.
// (A leader stores its first entry before it applies the log: only kept
// entries from that index on are dropped, which are none.)

// replayCacheBytes bounds the memory kept: entry data and about
// replayEntryCost more per entry (the raft.Log and room to grow).
const (
	replayCacheBytes = 64 << 20
	replayEntryCost  = 192
)

// replayCache keeps log entries contiguous from first.
type replayCache struct {
	// used is whether it fills or keeps anything; once not, every call
	// returns at once (a node's reads and writes of the log after its
	// start take no lock here).
	used    atomic.Bool
	mu      sync.Mutex
	filling bool
	first   uint64     // index of logs[0]
	logs    []raft.Log // entries first, first+1, ...
	bytes   int        // memory kept (cost)
}

// cost is what an entry kept counts toward replayCacheBytes.
func cost(l *raft.Log) int { return len(l.Data) + len(l.Extensions) + replayEntryCost }

// fill starts (true) or ends (false) the filling.
func (c *replayCache) fill(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.filling = on
	c.settle()
}

// settle notes, after a change under mu, whether the cache is used, and
// lets an emptied slice go.
func (c *replayCache) settle() {
	if len(c.logs) == 0 {
		c.logs = nil
	}
	c.used.Store(c.filling || c.logs != nil)
}

// keep caches l, just read from the log, while filling: after the entries
// kept when it extends them, else in their place (NewRaft reads the last
// entry before the ones after the snapshot). Past replayCacheBytes the
// filling ends.
func (c *replayCache) keep(l *raft.Log) {
	if !c.used.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.filling {
		return
	}
	if c.bytes+cost(l) > replayCacheBytes {
		c.filling = false
		c.settle()
		return
	}
	if len(c.logs) == 0 || l.Index != c.first+uint64(len(c.logs)) {
		c.drop(0, uint64(len(c.logs)))
		c.logs, c.first = c.logs[:0], l.Index
	}
	c.logs = append(c.logs, *l)
	c.bytes += cost(l)
}

// take fills l with entry i if it is kept. The apply's read, of the first
// kept entry once the filling is over, drops it; another read leaves it
// (NewRaft reads the last entry twice when it is the only one after the
// snapshot).
func (c *replayCache) take(i uint64, l *raft.Log) bool {
	if !c.used.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.logs) == 0 || i < c.first || i-c.first >= uint64(len(c.logs)) {
		return false
	}
	*l = c.logs[i-c.first]
	if i == c.first && !c.filling {
		c.drop(0, 1)
		c.logs, c.first = c.logs[1:], i+1
		c.settle()
	}
	return true
}

// release drops every kept entry and ends the filling.
func (c *replayCache) release() { c.changing(0, math.MaxUint64) }

// changing is called before the log changes at indexes from to to (a
// store: from its first entry on; a delete): the filling ends, and every
// kept entry from from on goes, or, when from is at or before the first,
// every one up to to.
func (c *replayCache) changing(from, to uint64) {
	if !c.used.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.filling = false
	defer c.settle()
	if len(c.logs) == 0 || to < c.first {
		return
	}
	n := uint64(len(c.logs))
	if from > c.first {
		if from-c.first < n {
			n = from - c.first
			c.drop(n, uint64(len(c.logs)))
			c.logs = c.logs[:n]
		}
	} else {
		k := n // entries first..to, the ones kept
		if to-c.first < n {
			k = to - c.first + 1
		}
		c.drop(0, k)
		c.logs, c.first = c.logs[k:], c.first+k
	}
}

// drop lets kept entries [i, j) go (the caller reslices).
func (c *replayCache) drop(i, j uint64) {
	for k := i; k < j; k++ {
		c.bytes -= cost(&c.logs[k])
		c.logs[k] = raft.Log{}
	}
}
