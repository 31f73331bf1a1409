package guard

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lockd-dev/lockd/internal/auth"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// fromIP is the context of a call from addr with authentication off.
func fromIP(i int) context.Context {
	addr := fmt.Sprintf("10.%d.%d.%d:4000", i>>16&255, i>>8&255, i&255)
	return context.WithValue(context.Background(), callerKey{}, caller{addr: addr})
}

// TestLimiterEvictsIdleBuckets: the rate-limit buckets of client IPs (or
// identities) do not pile up: a bucket that has refilled is dropped by the
// next call, and however many distinct clients call at once the table
// stays within maxBuckets.
func TestLimiterEvictsIdleBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := testGuard(t, auth.Limits{Rate: 10, Burst: 5}).limits // full again 0.5 s after a call
		msg := &lockdv1.DescribeLockRequest{Name: "x"}
		size := func() int {
			l.mu.Lock()
			defer l.mu.Unlock()
			return len(l.buckets)
		}
		for i := range 1000 {
			if _, err := l.admit(fromIP(i), msg); err != nil {
				t.Fatal(err)
			}
		}
		if n := size(); n != 1000 {
			t.Fatalf("%d buckets after 1000 clients, want 1000", n)
		}
		time.Sleep(time.Second) // every bucket is full again: idle
		if _, err := l.admit(fromIP(0), msg); err != nil {
			t.Fatal(err)
		}
		if n := size(); n != 1 {
			t.Fatalf("%d buckets after the clients went idle and one called, want 1", n)
		}

		// A flood of distinct clients, none idle: the table is bounded,
		// the least recently used bucket goes first.
		for i := range maxBuckets + 5000 {
			if _, err := l.admit(fromIP(i), msg); err != nil {
				t.Fatal(err)
			}
		}
		if n := size(); n != maxBuckets {
			t.Fatalf("%d buckets after %d distinct clients, want %d", n, maxBuckets+5000, maxBuckets)
		}
		l.mu.Lock()
		_, oldest := l.buckets["ip:"+hostOf(callerOf(fromIP(0)).addr)]
		_, newest := l.buckets["ip:"+hostOf(callerOf(fromIP(maxBuckets+4999)).addr)]
		l.mu.Unlock()
		if oldest || !newest {
			t.Errorf("after the flood: oldest kept %v, newest kept %v; want the least recently used dropped", oldest, newest)
		}
		// A client still in its window keeps its bucket through the
		// eviction: its limit holds.
		for range 4 {
			if _, err := l.admit(fromIP(maxBuckets+4999), msg); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.admit(fromIP(maxBuckets+4999), msg); err == nil {
			t.Error("the sixth call of a client with burst 5 was admitted")
		}
		time.Sleep(time.Second)
		if _, err := l.admit(fromIP(1), msg); err != nil {
			t.Fatal(err)
		}
		if n := size(); n != 1 {
			t.Fatalf("%d buckets after the flood went idle, want 1", n)
		}
	})
}
