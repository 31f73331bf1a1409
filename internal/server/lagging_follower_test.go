package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// A follower that is down while the leader snapshots and truncates its log
// must catch up (InstallSnapshot, then AppendEntries) after it restarts.
func TestLaggingFollowerCatchesUpFromSnapshot(t *testing.T) {
	n := 3
	dirs := make([]string, n)
	trans := make([]*raft.InmemTransport, n)
	var boot []raft.Server
	for i := range n {
		dirs[i] = t.TempDir()
		boot = append(boot, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(fmt.Sprintf("n%d", i+1)), Address: raft.ServerAddress(fmt.Sprintf("n%d", i+1))})
	}
	cfg := func(i int) Config {
		c := testConfig(dirs[i])
		c.NodeID = fmt.Sprintf("n%d", i+1)
		c.HeartbeatTimeout, c.ElectionTimeout = 100*time.Millisecond, 100*time.Millisecond
		c.SnapshotThreshold = 50
		c.TrailingLogs = 10
		c.SnapshotInterval = time.Hour
		c.WALSegmentSize = 4096
		return c
	}
	srv := make([]*Server, n)
	link := func() {
		for i := range n {
			for j := range n {
				if i != j && trans[i] != nil && trans[j] != nil && srv[i] != nil && srv[j] != nil {
					trans[i].Connect(raft.ServerAddress(fmt.Sprintf("n%d", j+1)), trans[j])
				}
			}
		}
	}
	start := func(i int) {
		_, tr := raft.NewInmemTransportWithTimeout(raft.ServerAddress(fmt.Sprintf("n%d", i+1)), 100*time.Millisecond)
		trans[i] = tr
		s, err := New(cfg(i), WithRaftTransport(tr), WithBootstrapServers(boot), WithFatal(func(error) {}), WithLogger(testLogger(fmt.Sprintf("n%d", i+1))))
		if err != nil {
			t.Fatal(err)
		}
		srv[i] = s
		link()
	}
	for i := range n {
		start(i)
	}
	defer func() {
		for _, s := range srv {
			if s != nil {
				s.Close()
			}
		}
	}()
	leader := -1
	for deadline := time.Now().Add(10 * time.Second); leader < 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for i, s := range srv {
			if s.Ready() {
				leader = i
			}
		}
	}
	if leader < 0 {
		t.Fatal("no leader")
	}
	f := (leader + 1) % n
	propose(t, srv[leader], fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "s0", TtlMs: 3600000})
	time.Sleep(300 * time.Millisecond)
	t.Logf("follower n%d applied %d before stop", f+1, srv[f].raft.AppliedIndex())
	srv[f].Close()
	srv[f] = nil
	for i := range n {
		if trans[i] != nil {
			trans[i].Disconnect(raft.ServerAddress(fmt.Sprintf("n%d", f+1)))
		}
	}
	for i := range 1000 {
		propose(t, srv[leader], fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: fmt.Sprintf("s%d", i+1), TtlMs: 3600000})
	}
	time.Sleep(200 * time.Millisecond)
	for i := range n {
		if srv[i] != nil {
			if err := srv[i].raft.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, _ := srv[leader].wal.FirstIndex()
	t.Logf("leader first log index after snapshot: %d, last %d", first, srv[leader].raft.LastIndex())
	start(f)
	for i := range 20 {
		propose(t, srv[leader], fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: fmt.Sprintf("t%d", i+1), TtlMs: 3600000})
	}
	target := srv[leader].raft.AppliedIndex()
	deadline := time.Now().Add(5 * time.Second)
	for srv[f].raft.AppliedIndex() < target && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	fi, _ := srv[f].wal.FirstIndex()
	li, _ := srv[f].wal.LastIndex()
	st := srv[f].raft.Stats()
	t.Logf("follower wal [%d,%d] last_snapshot_index=%s last_log_index=%s", fi, li, st["last_snapshot_index"], st["last_log_index"])
	t.Logf("follower applied %d, leader %d; follower sessions %d, leader %d", srv[f].raft.AppliedIndex(), target, srv[f].fsm.Info().Sessions, srv[leader].fsm.Info().Sessions)
	if srv[f].raft.AppliedIndex() < target {
		t.Fatalf("follower n%d stuck at %d < %d", f+1, srv[f].raft.AppliedIndex(), target)
	}
}
