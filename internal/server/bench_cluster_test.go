package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
)

// benchCluster measures acquire+release pairs by 16 workers (each its own
// session) against an in-process 3-node cluster: every node fsyncs its own
// Raft log on disk; Raft traffic uses hashicorp/raft's in-memory transport,
// the API real loopback HTTP. Clients list the leader first, as a client
// that learned the leader would.
func benchCluster(b *testing.B, name func(w int) string) {
	c := newTestCluster(b, 3, defaultClusterOpts())
	li := c.leaderIndex()
	urls := c.urls()
	eps := append([]string{urls[li]}, append(urls[:li:li], urls[li+1:]...)...)
	cl, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(eps...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close(context.Background())
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(8) // ×GOMAXPROCS(2) = 16 workers
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		w := int(next.Add(1))
		s, err := cl.NewSession(ctx, lockd.WithTTL(30*time.Second))
		if err != nil {
			b.Error(err)
			return
		}
		defer s.Close(ctx)
		m := s.NewMutex(name(w))
		for pb.Next() {
			if err := m.Lock(ctx); err != nil {
				b.Error(err)
				return
			}
			if err := m.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}

func BenchmarkCluster3AcquireReleaseUncontended(b *testing.B) {
	benchCluster(b, func(w int) string { return fmt.Sprint("bench/uncontended/", w) })
}

func BenchmarkCluster3AcquireReleaseContended(b *testing.B) {
	benchCluster(b, func(int) string { return "bench/contended" })
}
