package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestSnapshotMetrics: a snapshot is timed and its size noted.
func TestSnapshotMetrics(t *testing.T) {
	s := startServer(t, testConfig(t.TempDir()))
	defer s.Close()
	propose(t, s, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "s1", TtlMs: 60000, RequestId: "r1"})
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	snapshotSeconds, snapshotBytes := s.nd.Parts().LockMetrics.SnapshotMetrics()
	var m dto.Metric
	if err := snapshotSeconds.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetHistogram().GetSampleCount(); got < 1 {
		t.Fatalf("snapshot duration samples = %d, want at least 1", got)
	}
	if got := testutil.ToFloat64(snapshotBytes); got <= 0 {
		t.Fatalf("snapshot size = %v, want > 0", got)
	}
}
