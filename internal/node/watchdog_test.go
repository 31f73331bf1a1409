package node

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestWatchdogCountsOnlyRunningTime: a proposal that waits while the ticks
// come on time (a hung disk) reaches the limit; one that waited across a
// pause of the whole process (no tick for longer than the limit, then one)
// does not, and a proposal begun after the pause is measured in full.
func TestWatchdogCountsOnlyRunningTime(t *testing.T) {
	const interval, limit = 500 * time.Millisecond, 6 * time.Second
	synctest.Test(t, func(t *testing.T) {
		w := newWatchdog(limit)
		w.tick(interval)
		end := w.begin()
		for range 13 { // 6.5 s of ticks on time
			time.Sleep(interval)
			if got := w.tick(interval); got > 13*interval {
				t.Fatalf("stalled %v after at most %v", got, 13*interval)
			}
		}
		if got := w.tick(interval); got < limit {
			t.Fatalf("a proposal waiting 6.5 s with every tick on time: %v, want ≥ %v", got, limit)
		}
		end()

		end = w.begin()
		time.Sleep(interval)
		w.tick(interval)
		time.Sleep(7 * time.Second) // the process stopped: no tick
		if got := w.tick(interval); got >= limit || got < interval {
			t.Fatalf("after a 7 s pause: stalled %v, want the running time only (≥ %v, < %v)", got, interval, limit)
		}
		end()
	})
}
