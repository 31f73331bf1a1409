package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

func testConfig(dir string) Config {
	cfg := DefaultConfig()
	cfg.DataDir = dir
	cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
	cfg.MinTTL = 100 * time.Millisecond
	return cfg
}

func startServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctxWait(t, s)
	return s
}

// ctxWait waits until s is the established leader.
func ctxWait(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		s.Close()
		t.Fatal(err)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func propose(t *testing.T, s *Server, ct fsm.CmdType, m proto.Message) *fsm.Result {
	t.Helper()
	r, err := s.node.Propose(ct, m)
	if err != nil {
		t.Fatal(err)
	}
	if r.Code != fsm.OK {
		t.Fatalf("command %d: %v", ct, r.Err())
	}
	return r
}

// TestSnapshotAndLogReplayAcrossRestart: state written before a snapshot
// (restored from it) and after it (replayed from the log) both survive a
// restart, equal to the state before.
func TestSnapshotAndLogReplayAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := startServer(t, cfg)
	cfg.Listen, cfg.RaftListen = s.Addr().String(), s.RaftAddr() // restart on the same addresses
	apply := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprint("s", i)
			propose(t, s, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 60000, RequestId: "r" + id, SecretHash: testSecretHash})
			propose(t, s, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: id, Seq: 1, Name: fmt.Sprint("lock/", i%7), Mode: fsm.ModeExclusive, Wait: true, SecretHash: testSecretHash})
		}
	}
	apply(0, 50)
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	apply(50, 80)
	want := s.fsm.State()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = startServer(t, cfg)
	defer s.Close()
	if got := s.fsm.State(); !proto.Equal(got, want) {
		t.Fatalf("state after restart differs:\ngot  %.2000v\nwant %.2000v", got, want)
	}
	// The restarted leader restarted every lease.
	for _, x := range want.Sessions {
		if _, ok := s.lease.Deadline(x.Id); !ok {
			t.Fatalf("session %s has no lease timer after restart", x.Id)
		}
	}
}

func TestDataDirLocked(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := startServer(t, cfg)
	defer s.Close()
	if s2, err := New(cfg); err == nil {
		s2.Close()
		t.Fatal("second server on the same data dir started")
	} else if got := err.Error(); !strings.Contains(got, "in use") {
		t.Fatalf("error %q does not say the data dir is in use", got)
	}
}

func TestNodeIDNeverChanges(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.NodeID = "n1"
	s := startServer(t, cfg)
	s.Close()
	cfg.NodeID = "n2"
	if s2, err := New(cfg); err == nil {
		s2.Close()
		t.Fatal("started with another node id on the same data dir")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"wildcard listen", func(c *Config) { c.Listen = "0.0.0.0:7070" }},
		{"no port", func(c *Config) { c.Listen = "127.0.0.1" }},
		{"min above max", func(c *Config) { c.MinTTL, c.MaxTTL = time.Hour, time.Second }},
		{"zero ttl", func(c *Config) { c.DefaultTTL = 0 }},
		{"empty data dir", func(c *Config) { c.DataDir = "" }},
		{"tiny heartbeat", func(c *Config) { c.HeartbeatTimeout = time.Microsecond }},
	} {
		cfg := DefaultConfig()
		tc.edit(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", tc.name, cfg)
		}
	}
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	if cfg.Grace != cfg.ElectionTimeout {
		t.Fatalf("default grace %v, want the election timeout", cfg.Grace)
	}
}

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
			r, err = srv[leader()].node.Propose(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, RequestId: id, TtlMs: 3600000, SecretHash: testSecretHash})
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
	first, _ := srv[l].nd.Hooks().WAL().FirstIndex()
	t.Logf("leader first log index after snapshot: %d, last %d", first, srv[l].raft.LastIndex())
	start(f)
	for i := range 20 {
		create(fmt.Sprintf("t%d", i+1))
	}
	l = leader()
	target := srv[l].raft.AppliedIndex()
	ok := caughtUp(f, target)
	fi, _ := srv[f].nd.Hooks().WAL().FirstIndex()
	li, _ := srv[f].nd.Hooks().WAL().LastIndex()
	st := srv[f].raft.Stats()
	t.Logf("follower wal [%d,%d] last_snapshot_index=%s last_log_index=%s", fi, li, st["last_snapshot_index"], st["last_log_index"])
	t.Logf("follower applied %d, leader %d; follower sessions %d, leader %d", srv[f].raft.AppliedIndex(), target, srv[f].fsm.Info().Sessions, srv[l].fsm.Info().Sessions)
	if !ok {
		t.Fatalf("follower n%d stuck at %d < %d", f+1, srv[f].raft.AppliedIndex(), target)
	}
}

// TestSnapshotByLogSize: with Raft's own triggers out of reach (an hour's
// interval, a huge entry threshold), a node that writes SnapshotLogBytes to
// its log takes a snapshot at once, so a restart replays a bounded log.
func TestSnapshotByLogSize(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.SnapshotInterval, cfg.SnapshotThreshold = time.Hour, 1<<40
	cfg.SnapshotLogBytes = 16 << 10
	s := startServer(t, cfg)
	defer s.Close()
	propose(t, s, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: "a", TtlMs: 60000})
	for i := 0; func() uint64 { n, _ := s.nd.Hooks().LogBytes(); return n }() < 2*cfg.SnapshotLogBytes; i++ {
		propose(t, s, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "a", Seq: uint64(i + 1), Ack: uint64(i), Name: fmt.Sprint("lock/", i), Mode: fsm.ModeExclusive})
	}
	select {
	case <-func() <-chan struct{} { _, c := s.nd.Hooks().LogBytes(); return c }():
	case <-time.After(10 * time.Second):
		t.Fatalf("no snapshot after %d log bytes (limit %d)", func() uint64 { n, _ := s.nd.Hooks().LogBytes(); return n }(), cfg.SnapshotLogBytes)
	}
	if idx, _ := strconv.ParseUint(s.raft.Stats()["last_snapshot_index"], 10, 64); idx == 0 {
		t.Fatal("raft reports no snapshot")
	}
}
