package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/loadgen"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// update rewrites testdata/*.golden from the current output:
// go test ./cmd/lockd -run Golden -update.
var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// The answers the golden outputs are rendered from: the README's quick
// start (one `lockd run` holding invoices/2026-11), with a second run
// queued behind it for describe and top. Fixed values, so the outputs are
// the same on every run and the docs can quote them.
var (
	goldenNow      = time.Date(2026, 11, 30, 22, 32, 24, 0, time.UTC)
	goldenHolder   = "01f5db73f0a2b1239bd5dfa40a7db7fb"
	goldenWaiter   = "9c2e41d07a5b3f86e1d4c0b7a2f95e38"
	goldenToken    = uint64(1796077942785131)
	goldenNode     = "d11154a7c4793476"
	goldenHeldLock = &lockdv1.LockInfo{
		Name: "invoices/2026-11", Limit: 1,
		Holders: []*lockdv1.Holder{{
			SessionId: goldenHolder, Mode: lockdv1.Mode_MODE_EXCLUSIVE, Token: goldenToken,
			GrantedAt: timestamppb.New(goldenNow.Add(-time.Second)), Owner: "host/6416",
		}},
	}
)

// goldenQueuedLock is goldenHeldLock with a second `lockd run` waiting.
func goldenQueuedLock() *lockdv1.LockInfo {
	l := &lockdv1.LockInfo{Name: goldenHeldLock.Name, Limit: 1, Holders: goldenHeldLock.Holders}
	l.Waiters = []*lockdv1.Waiter{{
		SessionId: goldenWaiter, Mode: lockdv1.Mode_MODE_EXCLUSIVE,
		QueuedAt: timestamppb.New(goldenNow.Add(-4 * time.Second)), Owner: "host/6502",
	}}
	return l
}

// goldenAskedLock is goldenQueuedLock after an admin asked its holder to
// let go (`lockd request-release`), on a lock with a 1m revoke grace.
func goldenAskedLock() *lockdv1.LockInfo {
	l := goldenQueuedLock()
	h := proto.Clone(l.Holders[0]).(*lockdv1.Holder)
	h.ReleaseRequestedAt = timestamppb.New(goldenNow.Add(-2 * time.Second))
	h.ReleaseReason = "database migration at 23:00"
	h.RevokeGrace = durationpb.New(time.Minute)
	l.Holders = []*lockdv1.Holder{h}
	return l
}

func goldenStatus() *lockdv1.StatusResponse {
	return &lockdv1.StatusResponse{
		NodeId: goldenNode, Leader: goldenNode, State: "Leader", Term: 2, CommitIndex: 10, AppliedIndex: 10,
		Sessions: 2, Locks: 1, ClusterId: "7683e10caad953a69d6a1c09d04ac774", LastToken: goldenToken, Version: "v0.9.0",
		Members: []*lockdv1.Member{{Id: goldenNode, Api: "http://127.0.0.1:7070", Raft: "127.0.0.1:7071", Role: "leader", Voter: true}},
	}
}

func goldenSessions() []*lockdv1.SessionInfo {
	return []*lockdv1.SessionInfo{
		{SessionId: goldenHolder, Owner: "host/6416", Ttl: durationpb.New(10 * time.Second), CreatedAt: timestamppb.New(goldenNow.Add(-time.Second)),
			Holds: 1, ExpiresAt: timestamppb.New(goldenNow.Add(9400 * time.Millisecond))},
		{SessionId: goldenWaiter, Owner: "host/6502", Ttl: durationpb.New(10 * time.Second), CreatedAt: timestamppb.New(goldenNow.Add(-4 * time.Second)),
			Waits: 1, ExpiresAt: timestamppb.New(goldenNow.Add(8100 * time.Millisecond))},
	}
}

// goldenOutputs renders every documented CLI output from the fixed
// answers, by the same functions the commands print with. Each names the
// page that quotes it.
func goldenOutputs(t *testing.T) []struct{ name, doc, out string } {
	t.Helper()
	render := func(f func(*bytes.Buffer) error) string {
		var b bytes.Buffer
		if err := f(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	top := &topState{flags: topFlags{rows: 8, interval: time.Second}, changes: map[string]int{}, tokens: map[string]uint64{}}
	fairness := 0.97
	bench := &loadgen.Report{
		System: "lockd", Version: "v0.9.0", Endpoints: []string{"127.0.0.1:7070"}, Workload: "own", Op: "acquire+release pair",
		Clients: 16, TTLSeconds: 10, WarmupSeconds: 2, Seconds: 10, Ops: 16031, OpsPerSecond: 1603.1,
		LatencyMicros: loadgen.Latency{Count: 16031, P50: 6360, P90: 15480, P99: 83200, Max: 196610},
		Errors:        map[string]int64{}, ConnsOpened: 0, ConnsTotal: 16, ClientCPUSeconds: 2.57, ClientCPUPercent: 26,
		ClientCPUMicrosPerOp: 160, ClientMaxRSSBytes: 23 << 20,
	}
	benchOne := *bench
	benchOne.Workload, benchOne.Op, benchOne.Ops, benchOne.OpsPerSecond = "one", "grant of the shared lock", 9512, 951.2
	benchOne.LatencyMicros = loadgen.Latency{Count: 9512, P50: 15870, P90: 24110, P99: 61950, Max: 140290}
	benchOne.PerWorkerOps, benchOne.Fairness = []int64{580, 598}, &fairness
	benchOne.Errors = map[string]int64{"no-leader": 2}
	benchOne.ErrorSamples = map[string]string{"no-leader": "acquire \"bench/one\": no leader"}
	return []struct{ name, doc, out string }{
		{"ls", "docs/cli.md", render(func(b *bytes.Buffer) error {
			return writeLocks(b, &lockdv1.ListLocksResponse{Locks: []*lockdv1.LockInfo{goldenHeldLock}}, nil, goldenNow)
		})},
		{"describe", "docs/cli.md", render(func(b *bytes.Buffer) error {
			return writeLock(b, &lockdv1.DescribeLockResponse{Lock: goldenQueuedLock()}, []string{"invoices/2026-11"}, goldenNow)
		})},
		{"explain", "docs/lock-semantics.md", render(func(b *bytes.Buffer) error {
			return writeExplain(b, &lockdv1.ExplainResponse{Lock: goldenQueuedLock(), Chain: []*lockdv1.WaitStep{
				{Depth: 1, SessionId: goldenHolder, Owner: "host/6416", Lock: "ledger/eu", QueuedAt: timestamppb.New(goldenNow.Add(-12 * time.Second)),
					BlockedBy: "5b0e9d2c47a13f8e6c1d0a9b8f7e6d5c", BlockedByOwner: "host/7120", Holding: true},
				{Depth: 2, SessionId: "5b0e9d2c47a13f8e6c1d0a9b8f7e6d5c", Owner: "host/7120", Lock: "ledger/us", QueuedAt: timestamppb.New(goldenNow.Add(-30 * time.Second)),
					BlockedBy: "a7c3e5f1d9b2846e0c4a8f6d2b1e9c7a", BlockedByOwner: "host/7311", Holding: true},
			}}, []string{"invoices/2026-11"}, goldenNow)
		})},
		{"describe-asked", "docs/cli.md", render(func(b *bytes.Buffer) error {
			return writeLock(b, &lockdv1.DescribeLockResponse{Lock: goldenAskedLock(), Policy: &lockdv1.LockPolicy{RevokeGrace: durationpb.New(time.Minute)}}, []string{"invoices/2026-11"}, goldenNow)
		})},
		{"request-release", "docs/cli.md", render(func(b *bytes.Buffer) error {
			return writeReleaseRequest(b, "invoices/2026-11", lockd.RequestReleaseResult{Holders: 1, RevokeGrace: time.Minute})
		})},
		{"policy", "docs/cli.md", render(func(b *bytes.Buffer) error {
			return writePolicy(b, "invoices/2026-11", lockd.LockPolicy{DefaultMaxHold: 2 * time.Hour, RevokeGrace: time.Minute})
		})},
		{"sessions", "docs/cli.md", render(func(b *bytes.Buffer) error {
			return writeSessions(b, &lockdv1.ListSessionsResponse{Sessions: goldenSessions()}, nil, goldenNow)
		})},
		{"status", "docs/cli.md", render(func(b *bytes.Buffer) error { return writeStatus(b, goldenStatus(), nil, goldenNow) })},
		{"top", "docs/dashboard.md", top.render(&topSnapshot{status: goldenStatus(), locks: []*lockdv1.LockInfo{goldenQueuedLock()}, sessions: goldenSessions()}, goldenNow, 0, 0, "\n")},
		{"busy", "docs/cli.md", render(func(b *bytes.Buffer) error {
			m := &Main{Stderr: b}
			busy := &lockd.BusyError{Name: "invoices/2026-11", Holders: []lockd.Holder{{SessionID: goldenHolder, Owner: "host/6416", Token: goldenToken}}}
			if got := m.exitStatus(exitWith(exitConflict, busyError(busy))); got != exitConflict {
				t.Errorf("busy: exit status %d, want %d", got, exitConflict)
			}
			return nil
		})},
		{"observe", "docs/events.md", leaderLine(lockd.Leader{}) +
			leaderLine(lockd.Leader{SessionID: goldenHolder, Owner: "host/6416", Value: []byte("http://10.0.0.5:8080"), Token: goldenToken}) +
			leaderLine(lockd.Leader{})},
		{"bench", "docs/benchmarks.md", render(func(b *bytes.Buffer) error { return bench.WriteTable(b) })},
		{"bench-one", "docs/benchmarks.md", render(func(b *bytes.Buffer) error { return benchOne.WriteTable(b) })},
	}
}

// TestGolden compares every documented CLI output with its golden file
// (testdata/NAME.golden), and checks that the page documenting it quotes
// it verbatim, so the docs and the CLI cannot drift apart. After a
// deliberate change: go test ./cmd/lockd -run Golden -update, then paste
// the new output into the page.
func TestGolden(t *testing.T) {
	for _, g := range goldenOutputs(t) {
		t.Run(g.name, func(t *testing.T) {
			path := filepath.Join("testdata", g.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(g.out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if g.out != string(want) {
				t.Errorf("%s output changed; got:\n%s\nwant (%s):\n%s", g.name, g.out, path, want)
			}
			doc, err := os.ReadFile(filepath.Join(repoRoot, g.doc))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(doc), "```\n"+string(want)+"```\n") {
				t.Errorf("%s does not quote %s as a code block of its own; paste it:\n```\n%s```", g.doc, path, want)
			}
		})
	}
}

// TestGoldenQuickStart checks the README's quick start against the same
// golden outputs: the lines after its `lockd ls` and its busy `lockd run`
// are the ls and busy goldens, commented.
func TestGoldenQuickStart(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ after, golden string }{
		{"./lockd ls\n", "ls"},
		{"./lockd run --no-wait invoices/2026-11 -- ./send-invoices.sh; echo \"exit $?\"\n", "busy"},
	} {
		want, err := os.ReadFile(filepath.Join("testdata", q.golden+".golden"))
		if err != nil {
			t.Fatal(err)
		}
		quoted := q.after + "# " + strings.ReplaceAll(strings.TrimSuffix(string(want), "\n"), "\n", "\n# ") + "\n"
		if !strings.Contains(string(readme), quoted) {
			t.Errorf("README.md's quick start does not quote testdata/%s.golden; want:\n%s", q.golden, quoted)
		}
	}
}
