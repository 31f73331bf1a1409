package heapcap

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

const mib = 1 << 20

func TestLimit(t *testing.T) {
	for _, tc := range []struct {
		name                                        string
		floor, live, total, released, objects, free uint64
		want                                        int64
	}{
		// other: total - released - objects - free (the heap's unused
		// span room is in it).
		{name: "small heap: the floor", floor: 128 * mib, live: 20 * mib, total: 60 * mib, released: 5 * mib, objects: 30 * mib, free: 3 * mib, want: (20 + 128 + 22) * mib},
		{name: "large heap: a quarter", floor: 128 * mib, live: 800 * mib, total: 1100 * mib, released: 100 * mib, objects: 900 * mib, free: 40 * mib, want: (800 + 200 + 60) * mib},
		// A table partly released: its spans hold much unused room, which
		// the runtime counts against the limit, so the limit is above
		// what the process uses, by the headroom.
		{name: "fragmented", floor: 128 * mib, live: 120 * mib, total: 420 * mib, objects: 200 * mib, free: 10 * mib, want: (120 + 128 + 210) * mib},
		{name: "no live heap yet", floor: 64 * mib, total: 4 * mib, objects: 1 * mib, want: (64 + 3) * mib},
		{name: "classes above the total", floor: 1, live: 8, total: 4, objects: 8, want: 8 + 2},
		{name: "huge", floor: math.MaxUint64 / 2, live: math.MaxUint64 / 2, want: 1 << 62},
		{name: "a floor that would wrap", floor: math.MaxUint64 - mib, live: 300 * mib, total: 400 * mib, objects: 300 * mib, want: 1 << 62},
	} {
		if got := Limit(tc.floor, tc.live, tc.total, tc.released, tc.objects, tc.free); got != tc.want {
			t.Errorf("%s: Limit = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestCapFollowsLiveHeap runs Cap in this process: after a collection with
// 96 MiB more live, the limit rises by at least that; once it is garbage, it falls again; Stop puts
// the previous limit back.
func TestCapFollowsLiveHeap(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	updates := make(chan int64, 1000)
	c := start(8*mib, func(l int64) {
		select {
		case updates <- l:
		default:
		}
	})
	defer c.Stop()
	if got := debug.SetMemoryLimit(-1); got != c.Limit() || got <= 8*mib {
		t.Fatalf("after Start: runtime limit %d, Cap.Limit %d; want equal and above the floor", got, c.Limit())
	}
	// until waits for the update after a collection that satisfies ok.
	until := func(what string, ok func(int64) bool) int64 {
		t.Helper()
		deadline := time.After(30 * time.Second)
		runtime.GC()
		for {
			select {
			case l := <-updates:
				if ok(l) {
					// Later updates may be queued; the runtime's
					// limit is the newest, and holds too.
					if got := debug.SetMemoryLimit(-1); !ok(got) {
						t.Fatalf("%s: runtime limit %d, but an update set %d", what, got, l)
					}
					return l
				}
				runtime.GC()
			case <-deadline:
				t.Fatalf("%s: no such update in 30 s (last limit %d)", what, c.Limit())
			}
		}
	}
	base := until("first collection", func(int64) bool { return true })

	live := make([]byte, 96*mib)
	for i := range live {
		live[i] = byte(i)
	}
	grown := until("with 96 MiB more live", func(l int64) bool { return l >= base+96*mib })
	runtime.KeepAlive(live)
	live = nil
	until("with it garbage again", func(l int64) bool { return l < grown-64*mib })

	c.Stop()
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("after Stop: limit %d, want %d as before Start", got, before)
	}
	runtime.GC()
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("after Stop and a collection: limit %d, want %d", got, before)
	}
}
