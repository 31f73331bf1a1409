package node

import (
	"sync"

	"github.com/hashicorp/raft"
)

// A restarting node reads the log written after its snapshot twice:
// raft.NewRaft reads every entry for configuration changes, and the node
// reads each again to apply it once the entries are known committed. With
// 1 000 000 locks that log may be some 10 MB and 70 000 entries (a
// snapshot is taken when the log reaches an eighth of the last one), one
// pread each, and 0.4 s of each pass. So the entries the first pass reads
// are kept, up to replayCacheBytes, and each read again is served from
// memory and dropped, with every entry before it.
//
// The cache only fills while NewRaft runs, before Raft has a goroutine of
// its own, so it holds what the log held then. The log changes only
// through StoreLogs and DeleteRange (an entry is never rewritten in place;
// a follower's conflicting tail is deleted first), and either one stops
// the filling and first drops every kept entry it could touch: a read
// served from the cache is what a read from the log would give. (A leader
// stores its first entry before it applies the log: only entries from
// that one's index on are dropped.)

// replayCacheBytes bounds the entry data kept.
const replayCacheBytes = 64 << 20

// replayCache keeps log entries contiguous from first.
type replayCache struct {
	mu      sync.Mutex
	filling bool
	first   uint64     // index of logs[0]
	logs    []raft.Log // entries first, first+1, ...
	bytes   int        // entry data kept
}

// fill starts (true) or ends (false) the filling.
func (c *replayCache) fill(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.filling = on
}

// keep caches l, just read from the log, while filling: after the entries
// kept when it extends them, else in their place (NewRaft reads the last
// entry before the ones after the snapshot). Past replayCacheBytes the
// filling ends.
func (c *replayCache) keep(l *raft.Log) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.filling {
		return
	}
	if c.bytes+len(l.Data) > replayCacheBytes {
		c.filling = false
		return
	}
	if len(c.logs) == 0 || l.Index != c.first+uint64(len(c.logs)) {
		c.drop(0, uint64(len(c.logs)))
		c.logs, c.first = c.logs[:0], l.Index
	}
	c.logs = append(c.logs, *l)
	c.bytes += len(l.Data)
}

// take fills l with entry i if it is kept, and drops it and every entry
// before it (a node reads the log forward; an earlier one read again
// comes from the log).
func (c *replayCache) take(i uint64, l *raft.Log) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.logs) == 0 || i < c.first || i-c.first >= uint64(len(c.logs)) {
		return false
	}
	n := i - c.first
	*l = c.logs[n]
	c.drop(0, n+1)
	c.logs, c.first = c.logs[n+1:], i+1
	if len(c.logs) == 0 {
		c.logs = nil
	}
	return true
}

// changing is called before the log changes at indexes from to to (a
// store: from its first entry on; a delete): the filling ends, and every
// kept entry from from on goes, or, when from is at or before the first,
// every one up to to.
func (c *replayCache) changing(from, to uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.filling = false
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
	if len(c.logs) == 0 {
		c.logs = nil
	}
}

// drop lets kept entries [i, j) go (the caller reslices).
func (c *replayCache) drop(i, j uint64) {
	for k := i; k < j; k++ {
		c.bytes -= len(c.logs[k].Data)
		c.logs[k] = raft.Log{}
	}
}
