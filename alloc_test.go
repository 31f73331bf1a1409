package lockd_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// Allocations per acquire+release pair (Mutex.Lock then Unlock, own lock,
// one session) through the real stack: the client, loopback HTTP, and an
// in-process node (Raft log on disk). The node shares the process, so its
// allocations count too; background work (keepalives, Raft) adds a little.
// Measured when the bounds were set: 183–184 with the session stream and
// 436 unary (client and node together; 229 and 465–466 before the client
// and the codec were trimmed).
//
// The bounds are a regression guard, not a target: a change that makes a
// pair allocate noticeably more fails here, and should either be undone or
// move the bound with a reason.
const (
	maxAllocsPerPairStream = 200
	maxAllocsPerPairUnary  = 470
)

// pairClient returns a client of a fresh in-process node, a session and a
// mutex on its own lock.
func pairClient(tb testing.TB) *lockd.Mutex {
	srv := lockdtest.New(tb)
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close(context.Background()) })
	s, err := c.NewSession(context.Background(), lockd.WithTTL(30*time.Second))
	if err != nil {
		tb.Fatal(err)
	}
	return s.NewMutex("alloc/pair")
}

func lockUnlock(tb testing.TB, m *lockd.Mutex) {
	ctx := context.Background()
	if err := m.Lock(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		tb.Fatal(err)
	}
}

// TestAllocsPerPair fails when an acquire+release pair allocates more than
// its bound (see maxAllocsPerPairStream).
func TestAllocsPerPair(t *testing.T) {
	if raceOn {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	if testing.Short() {
		t.Skip("short")
	}
	m := pairClient(t)
	for range 50 { // warm up: connections, stream, pools
		lockUnlock(t, m)
	}
	got := testing.AllocsPerRun(300, func() { lockUnlock(t, m) })
	bound := float64(maxAllocsPerPairStream)
	if !lockdtest.Stream() {
		bound = maxAllocsPerPairUnary
	}
	t.Logf("%.1f allocations per acquire+release pair (client and node; stream %v), bound %.0f", got, lockdtest.Stream(), bound)
	if got > bound {
		t.Errorf("%.1f allocations per acquire+release pair, more than the bound %.0f: find the new ones (go test -run XXX -bench BenchmarkPair -benchmem -memprofile)", got, bound)
	}
}

// BenchmarkPair is one worker's acquire+release pairs, one after
// another, against an in-process node: with -benchmem, allocs/op is per
// pair (client and node together).
func BenchmarkPair(b *testing.B) {
	m := pairClient(b)
	for range 50 {
		lockUnlock(b, m)
	}
	b.ReportAllocs()
	for b.Loop() {
		lockUnlock(b, m)
	}
}
