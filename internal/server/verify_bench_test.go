package server

import (
	"testing"
	"time"
)

// benchLinearizable measures the leadership check every KeepAlive and
// linearizable read pays (linearizable: VerifyLeader and, since the fresh
// quorum rule, the wait for replies to requests sent after the check began)
// on the leader of an in-process three-node cluster (in-memory Raft
// transport). parallel callers share checks (verify.go).
func benchLinearizable(b *testing.B, parallel int) {
	c := newTestCluster(b, 3, defaultClusterOpts())
	i, err := c.waitLeader(15 * time.Second)
	if err != nil {
		b.Fatal(err)
	}
	s := c.server(i)
	before, waits := s.nd.Hooks().VerifyChecks(), func() uint64 { n, _ := s.nd.Hooks().AckCounts(); return n }()
	b.ReportAllocs()
	b.SetParallelism(parallel)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.node.Linearizable(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(s.nd.Hooks().VerifyChecks()-before)/float64(b.N), "checks/op")
	b.ReportMetric(float64(func() uint64 { n, _ := s.nd.Hooks().AckCounts(); return n }()-waits)/float64(b.N), "waits/op")
}

// BenchmarkLinearizableSerial: one caller, so one check per call.
func BenchmarkLinearizableSerial(b *testing.B) { benchLinearizable(b, 1) }

// BenchmarkLinearizableParallel: 64 callers (32 × GOMAXPROCS 2) sharing
// checks.
func BenchmarkLinearizableParallel(b *testing.B) { benchLinearizable(b, 32) }
