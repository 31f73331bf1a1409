package redislock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/redislock"
	"github.com/lockd-dev/lockd/redislock/redistest"
)

// benchWorkers is the number of concurrent clients, as in the performance
// budget of docs/design.md and lockd's own benchmark (bench_test.go at the
// root).
const benchWorkers = 16

// benchAcquireRelease measures acquire+release pairs (Lock, then Unlock)
// by benchWorkers goroutines, each with its own Client, against one
// redis-server started with args. name picks the lock of worker w.
func benchAcquireRelease(b *testing.B, setup func(b *testing.B) func() func(name string) *redislock.Mutex, name func(w int) string) {
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism((benchWorkers + 1) / 2) // ×GOMAXPROCS(2) = 16
	newClient := setup(b)
	mutex := make([]func(string) *redislock.Mutex, benchWorkers)
	for i := range mutex {
		mutex[i] = newClient()
	}
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		w := int(next.Add(1))
		m := mutex[w%len(mutex)](name(w))
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
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
}

// single starts a redis-server with args; its result makes Clients.
func single(args ...string) func(b *testing.B) func() func(string) *redislock.Mutex {
	return func(b *testing.B) func() func(string) *redislock.Mutex {
		srv := redistest.New(b, args...)
		return func() func(string) *redislock.Mutex {
			c := newClient(b, srv, redislock.WithTTL(30*time.Second))
			return func(name string) *redislock.Mutex { return c.NewMutex(name) }
		}
	}
}

// redlock starts n redis-servers; its result makes Redlocks over them.
func redlock(n int) func(b *testing.B) func() func(string) *redislock.Mutex {
	return func(b *testing.B) func() func(string) *redislock.Mutex {
		srvs := servers(b, n)
		return func() func(string) *redislock.Mutex {
			r := newRedlock(b, srvs, redislock.WithTTL(30*time.Second), redislock.WithRequestTimeout(time.Second))
			return func(name string) *redislock.Mutex { return r.NewMutex(name) }
		}
	}
}

var durable = []string{"--appendonly", "yes", "--appendfsync", "always"}

func uncontended(w int) string { return fmt.Sprint("bench/uncontended/", w) }
func contended(int) string     { return "bench/contended" }

// BenchmarkAcquireReleaseRedis: single instance, each worker its own lock
// name; "durable" runs Redis with AOF appendfsync always (every grant
// fsynced before it is answered, as lockd does), "memory" without
// persistence.
func BenchmarkAcquireReleaseRedis(b *testing.B) {
	b.Run("memory/uncontended", func(b *testing.B) { benchAcquireRelease(b, single(), uncontended) })
	b.Run("memory/contended", func(b *testing.B) { benchAcquireRelease(b, single(), contended) })
	b.Run("durable/uncontended", func(b *testing.B) { benchAcquireRelease(b, single(durable...), uncontended) })
	b.Run("durable/contended", func(b *testing.B) { benchAcquireRelease(b, single(durable...), contended) })
}

// BenchmarkAcquireReleaseRedlock: Redlock over 3 in-memory nodes.
func BenchmarkAcquireReleaseRedlock(b *testing.B) {
	b.Run("3nodes/uncontended", func(b *testing.B) { benchAcquireRelease(b, redlock(3), uncontended) })
}
