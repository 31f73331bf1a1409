package node

import (
	"flag"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockd-dev/lockd/internal/loadgen"
)

// BenchmarkEntryBatch asks whether putting several lock commands into one
// Raft log entry would save CPU over one command per entry. hashicorp/raft
// already group-commits (its leader loop stores every proposal waiting in
// applyCh with one StoreLogs, one fsync), so a multi-command entry saves
// the per-entry work (raft.Log and future, raft-wal's framing and encoding,
// the FSM dispatch, the wakeup of each future) and whatever it changes in
// how many commands share an fsync.
//
// Raft runs on one node with the node's own stores and configuration: the
// data dir (openDataDir), raft-wal with its metadata store, the snapshot
// store and the countingLogStore wrapper (openStores), raft.Config
// (raftConfig), all with DefaultConfig() and the data dir in b.TempDir() (a
// real disk, unless $TMPDIR is a tmpfs: then the fsyncs cost nothing).
// Differences from Node.Start: an in-memory transport (one node, nothing
// is sent) without the ack tracker, no --join or --restore, no
// snapshot-by-log-size goroutine (a run is too short for a snapshot
// anyway), and a trivial FSM that only counts commands: this measures the
// Raft and log path, not lockd's FSM or its API.
//
// Sixteen workers (-entrybatch.workers) each propose one 60-byte command
// at a time, about an encoded Acquire:
//
//   - entry=1cmd: raft.Apply of each command, as Node.Propose does today.
//   - entry=batched/inflight=K: each command goes to a batcher queue; K
//     batcher goroutines each take every command waiting (1 to 64), apply
//     them concatenated as one entry, wait for it and wake its waiters. At
//     most K batch entries are in flight, so commands gather while an fsync
//     runs. A command ends when its entry is applied, as in entry=1cmd.
//
// Metrics: ns/op is wall time per command (16 workers: the inverse of
// throughput), cpu-µs/cmd the process's user+system CPU (getrusage) over
// the timed part per command, cmds/entry the commands per Raft entry,
// entries/fsync the entries per StoreLogs call (countingLogStore's
// counters; one StoreLogs is one raft-wal write and fsync), and cmds/fsync
// their product: each fsync costs CPU too, so compare cpu-µs/cmd between
// runs with similar cmds/fsync, or take the fsync share out first.
//
// Run: go test ./internal/node -run '^$' -bench EntryBatch -benchtime=3s
func BenchmarkEntryBatch(b *testing.B) {
	b.Run("entry=1cmd", func(b *testing.B) { benchEntryBatch(b, 0) })
	b.Run("entry=batched", func(b *testing.B) {
		b.Run("inflight=1", func(b *testing.B) { benchEntryBatch(b, 1) })
		b.Run("inflight=2", func(b *testing.B) { benchEntryBatch(b, 2) })
	})
}

// benchWorkers is the number of concurrent proposers:
// go test ./internal/node -run '^$' -bench EntryBatch -args -entrybatch.workers=32
var benchWorkers = flag.Int("entrybatch.workers", 16, "BenchmarkEntryBatch: concurrent proposers")

const (
	benchCmdBytes  = 60              // one command, about an encoded Acquire
	benchMaxBatch  = 64              // commands per batch entry, at most
	benchApplyWait = 5 * time.Second // raft.Apply's enqueue timeout
	benchLeaderMax = 10 * time.Second
)

// benchEntryBatch runs b.N commands through a fresh single-node Raft: one
// command per entry when inflight is 0, else through inflight batchers.
func benchEntryBatch(b *testing.B, inflight int) {
	if *benchWorkers < 1 || *benchWorkers > 4096 {
		b.Fatalf("-entrybatch.workers %d: want 1 to 4096", *benchWorkers)
	}
	br := openBenchRaft(b)
	payload := make([]byte, benchCmdBytes)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}

	var (
		next    atomic.Int64 // commands claimed by the workers
		entries atomic.Int64 // Raft entries proposed by the batchers
		errOnce sync.Once
		firstEr error
		failed  atomic.Bool
	)
	fail := func(err error) {
		errOnce.Do(func() { firstEr = err })
		failed.Store(true)
	}

	// The batchers (idle until the timed part begins).
	type request struct {
		data []byte
		done chan error
	}
	queue := make(chan *request, *benchWorkers) // each worker has one request out at most
	stop := make(chan struct{})
	var batchers sync.WaitGroup
	for range inflight {
		batchers.Add(1)
		go func() {
			defer batchers.Done()
			for {
				var first *request
				select {
				case first = <-queue:
				case <-stop:
					return
				}
				reqs := make([]*request, 1, benchMaxBatch)
				reqs[0] = first
			gather:
				for len(reqs) < benchMaxBatch {
					select {
					case q := <-queue:
						reqs = append(reqs, q)
					default:
						break gather
					}
				}
				buf := make([]byte, 0, len(reqs)*benchCmdBytes)
				for _, q := range reqs {
					buf = append(buf, q.data...)
				}
				entries.Add(1)
				err := br.r.Apply(buf, benchApplyWait).Error()
				for _, q := range reqs {
					q.done <- err
				}
			}
		}()
	}
	defer func() {
		close(stop)
		batchers.Wait()
	}()

	var workers sync.WaitGroup
	worker := func() {
		defer workers.Done()
		req := &request{data: payload, done: make(chan error, 1)}
		for !failed.Load() && next.Add(1) <= int64(b.N) {
			var err error
			if inflight == 0 {
				err = br.r.Apply(payload, benchApplyWait).Error()
			} else {
				queue <- req
				err = <-req.done
			}
			if err != nil {
				fail(err)
				return
			}
		}
	}

	batches0, stored0 := br.logCounts()
	applied0 := br.fsm.cmds.Load()
	b.ResetTimer()
	cpu0 := processCPU(b)
	for range *benchWorkers {
		workers.Add(1)
		go worker()
	}
	workers.Wait()
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	batches, stored := br.logCounts()
	batches, stored = batches-batches0, stored-stored0
	applied := br.fsm.cmds.Load() - applied0

	if firstEr != nil {
		b.Fatalf("apply: %v", firstEr)
	}
	if applied != int64(b.N) {
		b.Fatalf("the FSM applied %d commands, want %d", applied, b.N)
	}
	n := float64(b.N)
	if inflight == 0 {
		entries.Store(int64(b.N))
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/n, "cpu-µs/cmd")
	b.ReportMetric(n/float64(entries.Load()), "cmds/entry")
	if batches > 0 {
		b.ReportMetric(stored/batches, "entries/fsync")
		b.ReportMetric(n/batches, "cmds/fsync")
	}
}

// benchRaft is a single-node Raft on the node's stores and configuration.
type benchRaft struct {
	r    *raft.Raft
	logs *countingLogStore
	fsm  *countingFSM
}

// logCounts returns the batches (StoreLogs calls, one fsync each) and
// entries written to the log so far.
func (br *benchRaft) logCounts() (batches, entries float64) {
	return testutil.ToFloat64(br.logs.batches), testutil.ToFloat64(br.logs.entries)
}

// openBenchRaft opens the stores as Node.Start does (the package's own
// openDataDir, openStores and raftConfig), bootstraps a one-node cluster
// and waits until it leads with its log applied. Everything is shut down
// and closed when b's run ends.
func openBenchRaft(b *testing.B) *benchRaft {
	b.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = b.TempDir()
	reg := prometheus.NewRegistry()
	logger := slog.New(slog.DiscardHandler)
	s := &Node{cfg: cfg, log: logger}
	var closers []io.Closer // closed last first
	b.Cleanup(func() {
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i].Close(); err != nil {
				b.Errorf("close: %v", err)
			}
		}
	})
	if err := s.openDataDir(cfg); err != nil {
		b.Fatal(err)
	}
	closers = append(closers, s.dirLock)
	s.metrics = newMetrics(reg)
	hl := NewHclog(logger, "raft")
	stores, err := s.openStores(cfg, &Options{}, hl, reg, &closers)
	if err != nil {
		b.Fatal(err)
	}
	notify := make(chan bool, 16) // Raft tells leadership changes on it
	rc := s.raftConfig(cfg, hl, notify)
	addr, trans := raft.NewInmemTransport("")
	closers = append(closers, trans)
	conf := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: addr}}}
	if err := raft.BootstrapCluster(rc, stores.logs, stores.stable, stores.snaps, trans, conf); err != nil {
		b.Fatalf("bootstrap: %v", err)
	}
	br := &benchRaft{logs: stores.logs, fsm: &countingFSM{}}
	stores.logs.replay.fill(true) // as Node.Start
	br.r, err = raft.NewRaft(rc, br.fsm, stores.logs, stores.stable, stores.snaps, trans)
	stores.logs.replay.fill(false)
	if err != nil {
		b.Fatalf("start raft: %v", err)
	}
	b.Cleanup(func() {
		if err := br.r.Shutdown().Error(); err != nil {
			b.Errorf("raft shutdown: %v", err)
		}
		stores.logs.replay.release()
	})

	timeout := time.After(benchLeaderMax)
	for leader := false; !leader; {
		select {
		case leader = <-notify:
		case <-timeout:
			b.Fatalf("no leadership after %v (state %v)", benchLeaderMax, br.r.State())
		}
	}
	// The leader's first entry (and the bootstrap configuration) applied:
	// the timed part starts on an idle Raft.
	if err := br.r.Barrier(benchLeaderMax).Error(); err != nil {
		b.Fatalf("barrier: %v", err)
	}
	return br
}

// countingFSM is a raft.BatchingFSM that only counts the commands of the
// entries it is given (benchCmdBytes each).
type countingFSM struct {
	cmds atomic.Int64
}

// ApplyBatch counts the commands of logs.
func (f *countingFSM) ApplyBatch(logs []*raft.Log) []any {
	var n int64
	for _, l := range logs {
		if l.Type == raft.LogCommand {
			n += int64(len(l.Data) / benchCmdBytes)
		}
	}
	f.cmds.Add(n)
	return make([]any, len(logs))
}

// Apply counts the commands of l.
func (f *countingFSM) Apply(l *raft.Log) any {
	if l.Type == raft.LogCommand {
		f.cmds.Add(int64(len(l.Data) / benchCmdBytes))
	}
	return nil
}

// Snapshot returns an empty snapshot.
func (f *countingFSM) Snapshot() (raft.FSMSnapshot, error) { return emptySnapshot{}, nil }

// Restore discards the snapshot.
func (f *countingFSM) Restore(rc io.ReadCloser) error { return rc.Close() }

type emptySnapshot struct{}

func (emptySnapshot) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (emptySnapshot) Release()                             {}

// processCPU is the process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	c := loadgen.CPUTime()
	if c < 0 {
		b.Fatal("the process's CPU time cannot be read (getrusage)")
	}
	return c
}

var _ raft.BatchingFSM = (*countingFSM)(nil)
