package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
	r, err := s.propose(ct, m)
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
			propose(t, s, fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 60000, RequestId: "r" + id})
			propose(t, s, fsm.CmdAcquire, &fsmv1.Acquire{SessionId: id, Seq: 1, Name: fmt.Sprint("lock/", i%7), Mode: fsm.ModeExclusive, Wait: true})
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
