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
	// leader returns the established leader, waiting for one: on a busy
	// machine the 100ms timeouts make leadership move now and then.
	leader := func() int {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			for i, s := range srv {
				if s != nil && s.Ready() && s.raft.State() == raft.Leader {
					return i
				}
			}
		}
		t.Fatal("no leader")
		return -1
	}
	// create creates a session on whichever node leads. A proposal cut
	// short by a leadership change has an unknown outcome: it is repeated
	// on the new leader with the same request id, which makes it
	// idempotent.
	create := func(id string) {
		t.Helper()
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			var r *fsm.Result
			r, err = srv[leader()].propose(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, RequestId: id, TtlMs: 3600000})
			if err == nil {
				if r.Code != fsm.OK {
					t.Fatalf("create %s: %v", id, r.Err())
				}
				return
			}
		}
		t.Fatalf("create %s: %v", id, err)
	}
	// caughtUp waits until node i has applied index.
	caughtUp := func(i int, index uint64) bool {
		for deadline := time.Now().Add(10 * time.Second); srv[i].raft.AppliedIndex() < index; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				return false
			}
		}
		return true
	}
	l := leader()
	f := (l + 1) % n
	create("s0")
	if !caughtUp(f, srv[l].raft.AppliedIndex()) {
		t.Fatalf("follower n%d did not apply the first entries", f+1)
	}
	t.Logf("follower n%d applied %d before stop", f+1, srv[f].raft.AppliedIndex())
	srv[f].Close()
	srv[f] = nil
	for i := range n {
		if trans[i] != nil {
			trans[i].Disconnect(raft.ServerAddress(fmt.Sprintf("n%d", f+1)))
		}
	}
	for i := range 1000 {
		create(fmt.Sprintf("s%d", i+1))
	}
	l = leader()
	for i := range n {
		if srv[i] != nil {
			if !caughtUp(i, srv[l].raft.AppliedIndex()) {
				t.Fatalf("n%d did not catch up with the leader", i+1)
			}
			if err := srv[i].raft.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, _ := srv[l].wal.FirstIndex()
	t.Logf("leader first log index after snapshot: %d, last %d", first, srv[l].raft.LastIndex())
	start(f)
	for i := range 20 {
		create(fmt.Sprintf("t%d", i+1))
	}
	l = leader()
	target := srv[l].raft.AppliedIndex()
	ok := caughtUp(f, target)
	fi, _ := srv[f].wal.FirstIndex()
	li, _ := srv[f].wal.LastIndex()
	st := srv[f].raft.Stats()
	t.Logf("follower wal [%d,%d] last_snapshot_index=%s last_log_index=%s", fi, li, st["last_snapshot_index"], st["last_log_index"])
	t.Logf("follower applied %d, leader %d; follower sessions %d, leader %d", srv[f].raft.AppliedIndex(), target, srv[f].fsm.Info().Sessions, srv[l].fsm.Info().Sessions)
	if !ok {
		t.Fatalf("follower n%d stuck at %d < %d", f+1, srv[f].raft.AppliedIndex(), target)
	}
}
