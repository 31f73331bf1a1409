package node

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// watchdog notices a leader whose proposals stall. hashicorp/raft keeps
// heartbeating while its log store hangs (a hung disk), so followers never
// elect another leader and every write waits forever. When the oldest
// proposal in flight is older than the limit, the watchdog counts it and
// calls the fatal function (by default: log and exit the process), so the
// followers stop hearing heartbeats and elect a new leader.
//
// Time the process did not run (SIGSTOP, a VM pause, a starved machine)
// does not count: when the watchdog's own tick comes late by more than a
// tick, every proposal in flight is taken to have started that much later.
// A paused leader is deposed while it sleeps, and on waking would otherwise
// see its old proposals "stalled" and exit before Raft told it so. A hung
// disk leaves the process running, so the ticks come on time and count.
//
// It does not try a leadership transfer first: hashicorp/raft writes the log
// from its leader loop, the same loop that would run the transfer, so with a
// hung disk a transfer never starts (and its future is never answered).
type watchdog struct {
	limit time.Duration

	mu       sync.Mutex
	next     uint64
	inflight map[uint64]time.Time
	lastTick time.Time // the previous tick's time (zero before the first)
}

func newWatchdog(limit time.Duration) *watchdog {
	return &watchdog{limit: limit, inflight: map[uint64]time.Time{}}
}

// begin records a proposal; the returned func ends it.
func (w *watchdog) begin() func() {
	now := time.Now()
	w.mu.Lock()
	w.next++
	id := w.next
	w.inflight[id] = now
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.inflight, id)
		w.mu.Unlock()
	}
}

// tick returns, at a tick due every interval, how long the oldest proposal
// in flight has waited, not counting the time the ticks came late by more
// than an interval (the process did not run).
func (w *watchdog) tick(interval time.Duration) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if late := now.Sub(w.lastTick) - interval; !w.lastTick.IsZero() && late > interval {
		for id, t := range w.inflight {
			w.inflight[id] = t.Add(late)
		}
	}
	w.lastTick = now
	var max time.Duration
	for _, t := range w.inflight {
		if d := now.Sub(t); d > max {
			max = d
		}
	}
	return max
}

func (s *Node) runWatchdog() {
	defer s.wg.Done()
	tick := time.NewTicker(s.cfg.ElectionTimeout)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
		}
		stalled := s.watch.tick(s.cfg.ElectionTimeout)
		if stalled < s.watch.limit || s.raft.State() != raft.Leader {
			continue
		}
		s.metrics.watchdogTrips.Inc()
		s.fatal(fmt.Errorf("leader watchdog: a proposal has stalled for %v (limit %v); stopping so another node can lead", stalled, s.watch.limit))
		return
	}
}
