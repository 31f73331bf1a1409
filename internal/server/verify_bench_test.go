package server

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
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
	before, waits := s.verify.Checks(), s.acks.waits.Load()
	b.ReportAllocs()
	b.SetParallelism(parallel)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.linearizable(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(s.verify.Checks()-before)/float64(b.N), "checks/op")
	b.ReportMetric(float64(s.acks.waits.Load()-waits)/float64(b.N), "waits/op")
}

// BenchmarkLinearizableSerial: one caller, so one check per call.
func BenchmarkLinearizableSerial(b *testing.B) { benchLinearizable(b, 1) }

// BenchmarkLinearizableParallel: 64 callers (32 × GOMAXPROCS 2) sharing
// checks.
func BenchmarkLinearizableParallel(b *testing.B) { benchLinearizable(b, 32) }

// okTransport answers every AppendEntries at once with success: the cost
// measured is the wrapper's alone.
type okTransport struct{ raft.Transport }

func (okTransport) AppendEntries(_ raft.ServerID, _ raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	resp.Term, resp.Success = args.Term, true
	return nil
}

// BenchmarkAckTransportAppendEntries: what the wrapper adds to every
// heartbeat and append sent (a clock read and one uncontended lock; no
// allocation), against the bare call.
func BenchmarkAckTransportAppendEntries(b *testing.B) {
	req := &raft.AppendEntriesRequest{Term: 7}
	var resp raft.AppendEntriesResponse
	for _, bc := range []struct {
		name string
		tr   raft.Transport
	}{{"bare", okTransport{}}, {"wrapped", trackAcks(okTransport{}, &ackTracker{})}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.tr.AppendEntries("n2", "n2", req, &resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
