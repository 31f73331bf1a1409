package lockd_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// benchWorkers is the number of concurrent clients, as in the performance
// budget of docs/design.md (16 workers on loopback).
const benchWorkers = 16

// benchAcquireRelease measures acquire+release pairs by benchWorkers
// goroutines, each with its own session, against one durable in-process
// node (real Raft log on disk, fsync on every batch, loopback HTTP/2).
// name picks the lock of worker w.
func benchAcquireRelease(b *testing.B, name func(w int) string) {
	srv := lockdtest.New(b)
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism((benchWorkers + 1) / 2) // ×GOMAXPROCS(2) = 16
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		w := int(next.Add(1))
		s, err := c.NewSession(ctx, lockd.WithTTL(30*time.Second))
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
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	// Group commit: entries per Raft log write (one fsync each).
	if batches := scrape(b, srv.URL(), "lockd_raft_log_batches_total"); batches > 0 {
		b.ReportMetric(scrape(b, srv.URL(), "lockd_raft_log_entries_total")/batches, "entries/fsync")
	}
}

// scrape reads one unlabeled sample from the server's /metrics.
func scrape(b *testing.B, url, name string) float64 {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			return v
		}
	}
	b.Fatalf("metric %s not found", name)
	return 0
}

// BenchmarkAcquireReleaseUncontended: every worker locks its own name.
func BenchmarkAcquireReleaseUncontended(b *testing.B) {
	benchAcquireRelease(b, func(w int) string { return fmt.Sprint("bench/uncontended/", w) })
}

// BenchmarkAcquireReleaseContended: all workers queue on one name; every
// release hands the lock to the next waiter in one Raft entry.
func BenchmarkAcquireReleaseContended(b *testing.B) {
	benchAcquireRelease(b, func(int) string { return "bench/contended" })
}
