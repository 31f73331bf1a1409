package server

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestBigRestart measures how long a node holding many locks takes to
// serve again after a stop that leaves only what is on disk (a single
// node's Close hands nothing over and takes no snapshot, like kill -9).
// It is a measurement, not a timed assertion; it runs only with LOCKD_BIG
// set to the number of locks (1 for 1 000 000):
//
//	LOCKD_BIG=1 go test -run TestBigRestart -v -timeout 30m ./internal/server
//
// LOCKD_BIG_LOG_BYTES overrides SnapshotLogBytes (0: off, as before it
// existed). LOCKD_BIG_PROFILE=file writes a CPU profile of the restart. The locks
// are filled through Raft by 64 sessions; every lock and token must be
// there after the restart.
func TestBigRestart(t *testing.T) {
	env := os.Getenv("LOCKD_BIG")
	if env == "" {
		t.Skip("set LOCKD_BIG=1 (1 000 000 locks) or the number of locks")
	}
	n, err := strconv.Atoi(env)
	if err != nil {
		t.Fatalf("LOCKD_BIG=%q: %v", env, err)
	}
	if n == 1 {
		n = 1_000_000
	}
	const sessions = 64
	cfg := testConfig(t.TempDir())
	def := DefaultConfig() // the defaults' timing: a restart waits out one election
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = def.HeartbeatTimeout, def.ElectionTimeout
	cfg.WatchdogTimeout = time.Hour // a long replay holds up the first Barrier
	if v := os.Getenv("LOCKD_BIG_LOG_BYTES"); v != "" {
		// 0 measures the restart as it was before snapshots by log size.
		if cfg.SnapshotLogBytes, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("LOCKD_BIG_LOG_BYTES=%q: %v", v, err)
		}
	}
	s := startServer(t, cfg)
	cfg.Listen, cfg.RaftListen = s.Addr().String(), s.RaftAddr()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range sessions {
		wg.Go(func() {
			id := fmt.Sprint("s", w)
			if _, err := s.node.Propose(fsm.CmdCreateSession, &fsmv1.CreateSession{SessionId: id, TtlMs: 3600_000, SecretHash: testSecretHash}); err != nil {
				t.Error(err)
				return
			}
			for i := w; i < n; i += sessions {
				seq := uint64(i/sessions + 1)
				r, err := s.node.Propose(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: id, Seq: seq, Ack: seq - 1, Name: fmt.Sprintf("lock/%07d", i), Mode: fsm.ModeExclusive, SecretHash: testSecretHash})
				if err != nil || r.Code != fsm.OK {
					t.Errorf("acquire %d: %v %v", i, err, r)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		s.Close()
		return
	}
	t.Logf("filled %d locks through Raft in %v", n, time.Since(start).Round(time.Millisecond))
	want := s.fsm.State()
	info := s.fsm.Info()
	last := s.raft.LastIndex()
	snapIndex := s.raft.Stats()["last_snapshot_index"]
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("log: last index %d, last snapshot at %s", last, snapIndex)
	if f := os.Getenv("LOCKD_BIG_PROFILE"); f != "" {
		pf, err := os.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		pprof.StartCPUProfile(pf)
		defer pf.Close()
		defer pprof.StopCPUProfile() // also when the restart fails
	}
	start = time.Now()
	s, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opened := time.Since(start)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(start)
	pprof.StopCPUProfile()
	t.Logf("restart with %d locks: New returned after %v, serving (established leader) after %v", info.Locks, opened.Round(time.Millisecond), ready.Round(time.Millisecond))
	if got := s.fsm.State(); !proto.Equal(got, want) {
		t.Fatalf("state after restart differs (%d locks before, %d after)", info.Locks, s.fsm.Info().Locks)
	}
}
