// Package heapcap bounds how far a node's Go heap may grow past what is
// live, so a node holding a large lock table does not keep twice its state
// in memory.
//
// Go's collector, by default (GOGC=100), lets the heap grow to twice what
// the last collection found live before it collects again, and it keeps
// what it reached: an idle node allocates too little to trigger another
// collection, and the runtime returns only memory above that goal to the
// operating system. A node's live heap is mostly its lock table, which
// lives for as long as the locks are held, so at 1 000 000 locks (about
// 360 MB live) the process stayed at 700–850 MiB.
//
// After collections, Cap sets the runtime's soft memory limit
// (debug.SetMemoryLimit) to what is live plus the headroom (the larger of
// its floor and a quarter of the live heap) plus the rest of the memory
// the runtime counts against the limit: its own (stacks, collector
// metadata) and the unused room in the heap's spans. Below a live heap
// the size of the floor, Go's own goal (twice the live heap) is the lower
// one and nothing changes: small tables pay no extra collections. Above
// it, the heap collects when it has grown by the headroom, and the
// runtime returns what lies above the limit to the operating system.
//
// The update runs in a cleanup (runtime.AddCleanup) of an object freed by
// the collection, so it comes after the collection once the cleanup
// goroutine gets the CPU, usually before the next one: while the heap
// grows fast it may skip collections, and the limit then lags the live
// heap, which only makes the runtime collect sooner until it catches up.
//
// A soft limit never fails an allocation: past it the runtime collects
// more often, using at most about half of the CPU for it, and then lets
// the heap grow. A node whose live state grows between two collections
// gets a higher limit after the next one.
package heapcap

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// Cap keeps the soft memory limit at the live heap plus the headroom. Stop
// ends it.
type Cap struct {
	floor   uint64
	prev    int64
	stopped atomic.Bool
	limit   atomic.Int64

	mu      sync.Mutex // guards samples and orders updates with Stop
	samples []metrics.Sample
	// updated, if set (tests), is called after each update with the limit.
	updated func(int64)
}

// The runtime's metrics Cap reads (runtime/metrics).
const (
	metricLive     = "/gc/heap/live:bytes"
	metricTotal    = "/memory/classes/total:bytes"
	metricReleased = "/memory/classes/heap/released:bytes"
	metricObjects  = "/memory/classes/heap/objects:bytes"
	metricFree     = "/memory/classes/heap/free:bytes"
)

// Start sets the limit now and after every collection until Stop. floor
// is the least headroom, in bytes (above 0).
func Start(floor uint64) *Cap {
	return start(floor, nil)
}

func start(floor uint64, updated func(int64)) *Cap {
	c := &Cap{floor: floor, prev: debug.SetMemoryLimit(-1), updated: updated}
	for _, name := range []string{metricLive, metricTotal, metricReleased, metricObjects, metricFree} {
		c.samples = append(c.samples, metrics.Sample{Name: name})
	}
	c.update()
	c.arm()
	return c
}

// Limit returns the limit set last (0 before the first).
func (c *Cap) Limit() int64 { return c.limit.Load() }

// Stop ends the updates and restores the limit from before Start.
func (c *Cap) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped.Swap(true) {
		debug.SetMemoryLimit(c.prev)
	}
}

// sentinel is what arm lets go: a pointer-holding object, so it is never
// batched with other small objects by the tiny allocator and is freed by
// the first collection after arm.
type sentinel struct{ _ *byte }

// arm runs update (and arms again) after the next collection: the cleanup
// of an object nothing references runs once a collection has freed it.
func (c *Cap) arm() {
	runtime.AddCleanup(new(sentinel), func(c *Cap) {
		if !c.stopped.Load() {
			c.update()
			c.arm()
		}
	}, c)
}

func (c *Cap) update() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped.Load() {
		return
	}
	metrics.Read(c.samples)
	v := func(i int) uint64 {
		if c.samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return c.samples[i].Value.Uint64()
	}
	limit := Limit(c.floor, v(0), v(1), v(2), v(3), v(4))
	debug.SetMemoryLimit(limit)
	c.limit.Store(limit)
	if c.updated != nil {
		c.updated(limit)
	}
}

// maxLimit bounds Limit (and every sum in it): far above any machine's
// memory, far below overflow.
const maxLimit = 1 << 62

// Limit is the soft limit for a live heap of live bytes with the given
// headroom floor: live + max(floor, live/4) + the other memory the runtime
// counts against its limit. That is everything mapped and not released
// except heap objects and free heap pages (runtime.memoryLimitHeapGoal):
// the runtime's own memory, and the unused room in spans that hold
// objects (/memory/classes/heap/unused), which a table whose locks were
// partly released can hold a lot of. Counting that room as headroom
// instead would leave a limit below what the process uses after every
// collection: a collector running without pause.
func Limit(floor, live, total, released, objects, free uint64) int64 {
	other := uint64(0)
	if heap := released + objects + free; total > heap {
		other = total - heap
	}
	limit := uint64(0)
	for _, v := range []uint64{live, max(floor, live/4), other} {
		limit += min(v, maxLimit)
		if limit >= maxLimit {
			return maxLimit
		}
	}
	return int64(limit)
}
