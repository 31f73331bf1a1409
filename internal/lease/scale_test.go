package lease

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestHundredThousandEntries: 100 000 sessions on one manager; half keep
// alive, half do not. Each half ends exactly at its own receive + TTL +
// grace, and the manager holds no goroutine per entry meanwhile.
func TestHundredThousandEntries(t *testing.T) {
	const n = 100_000
	synctest.Test(t, func(t *testing.T) {
		var fired [n]atomic.Int64 // fake-time offset from start, +1
		start := time.Now()
		m := New(grace, func(id string, _ uint64) {
			var i int
			fmt.Sscanf(id, "s%d", &i)
			fired[i].Store(int64(time.Since(start)) + 1)
		})
		ids := make([]string, n)
		es := make([]Entry, n)
		for i := range es {
			ids[i] = fmt.Sprintf("s%d", i)
			es[i] = Entry{ID: ids[i], TTL: 10 * time.Second}
		}
		before := runtime.NumGoroutine()
		m.Promote(1, es)
		if got := runtime.NumGoroutine(); got > before {
			t.Fatalf("goroutines after promoting %d entries: %d, before %d", n, got, before)
		}
		// Even sessions keep alive every 3 s for 9 s; odd ones never do.
		for k := 1; k <= 3; k++ {
			time.Sleep(3 * time.Second)
			now := time.Now()
			for i := 0; i < n; i += 2 {
				if _, err := m.KeepAlive(ids[i], now); err != nil {
					t.Fatalf("keepalive %s: %v", ids[i], err)
				}
			}
		}
		synctest.Wait()
		for i := range n {
			if fired[i].Load() != 0 {
				t.Fatalf("%s expired at %v, before its deadline", ids[i], time.Duration(fired[i].Load()-1))
			}
		}
		time.Sleep(10*time.Second + grace - 9*time.Second)
		synctest.Wait()
		for i := range n {
			got, want := time.Duration(fired[i].Load()-1), 10*time.Second+grace
			if i%2 == 0 {
				if got != -1 {
					t.Fatalf("kept-alive %s expired at %v", ids[i], got)
				}
			} else if got != want {
				t.Fatalf("%s expired at %v, want %v", ids[i], got, want)
			}
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		for i := 0; i < n; i += 2 {
			if got, want := time.Duration(fired[i].Load()-1), 19*time.Second+grace; got != want {
				t.Fatalf("kept-alive %s expired at %v, want %v (last keepalive + TTL + grace)", ids[i], got, want)
			}
		}
		if got := m.Len(); got != n {
			t.Fatalf("entries: %d, want %d (expired entries stay until Removed)", got, n)
		}
		for _, id := range ids {
			m.Removed(id)
		}
		if len(m.heap) != 0 {
			t.Fatalf("heap holds %d entries after every Removed", len(m.heap))
		}
	})
}

// BenchmarkKeepAlive100k: the cost of one KeepAlive with 100 000 live
// entries on the manager (the heap is not touched; no allocation).
func BenchmarkKeepAlive100k(b *testing.B) {
	const n = 100_000
	m := New(grace, func(string, uint64) {})
	ids := make([]string, n)
	es := make([]Entry, n)
	for i := range es {
		ids[i] = fmt.Sprintf("s%d", i)
		es[i] = Entry{ID: ids[i], TTL: time.Hour}
	}
	m.Promote(1, es)
	defer m.Demote()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := m.KeepAlive(ids[i%n], time.Now()); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkCreatedRemoved100k: a session created and closed beside 100 000
// live ones (one heap push and one heap removal).
func BenchmarkCreatedRemoved100k(b *testing.B) {
	const n = 100_000
	m := New(grace, func(string, uint64) {})
	es := make([]Entry, n)
	for i := range es {
		es[i] = Entry{ID: fmt.Sprintf("s%d", i), TTL: time.Hour}
	}
	m.Promote(1, es)
	defer m.Demote()
	b.ReportAllocs()
	for b.Loop() {
		m.Created("x", time.Minute)
		m.Removed("x")
	}
}
