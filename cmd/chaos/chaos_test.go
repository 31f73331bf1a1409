package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"

	"github.com/lockd-dev/lockd/lockdtest"
)

// TestMain lets the test binary stand in for the chaos binary: the tool
// re-executes itself (os.Executable) as Go worker and as `lockd run`
// child.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "worker" || os.Args[1] == "write") {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// syncWriter serializes the tool's log lines into the test log.
type syncWriter struct {
	mu sync.Mutex
	t  *testing.T
}

func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// shortRun runs the short profile against real processes and returns its
// report. Without a Go toolchain to build lockd it skips, except in CI.
func shortRun(t *testing.T, broken string, seed uint64) *Report {
	t.Helper()
	if testing.Short() {
		t.Skip("real-process chaos run: skipped with -short")
	}
	// The report and history stay for a look when the test fails.
	out, err := os.MkdirTemp("", "lockd-chaos-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("report and history kept in %s", out)
			return
		}
		_ = os.RemoveAll(out)
	})
	cfg := &config{Seed: seed, Backend: backendLockd, Profile: "short", Nodes: 3, Clients: 6, Locks: 2, Pairs: 1, Broken: broken, Out: out}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var log io.Writer = &syncWriter{t: t}
	r, err := run(ctx, cfg, log)
	if err != nil && r == nil && strings.Contains(err.Error(), "go build") && os.Getenv("CI") != "true" {
		t.Skipf("cannot build lockd: %v", err)
	}
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	t.Log(summary(r))
	return r
}

// The short profile against a correct lockd: every fault kind once, no
// violation.
func TestShortProfile(t *testing.T) {
	r := shortRun(t, "", 1)
	if len(r.Violations) != 0 {
		t.Errorf("violations on a correct lockd:\n%s", strings.Join(r.Violations, "\n"))
	}
	for _, kind := range faultsFor(&config{Nodes: 3, Backend: backendLockd}) {
		if r.Faults[kind] != 1 {
			t.Errorf("fault %s injected %d times, want 1 (faults %v)", kind, r.Faults[kind], r.Faults)
		}
	}
	if r.Ops.Acquired < 50 || r.Ops.Runs < 100 || r.Linear != "ok" {
		t.Errorf("operations %+v, linearizable %s; want some load, checked", r.Ops, r.Linear)
	}
	// The Go workers took sets, and the pair's cycles were refused.
	if r.Sets.Granted == 0 || r.Cycles.Refused == 0 {
		t.Errorf("sets %+v, cycles %+v: want sets granted and cycles refused", r.Sets, r.Cycles)
	}
	// The hung leader's disk made its watchdog exit the process (and the
	// run then found one stable leader again, or it would have failed).
	events, err := readHistory(r.History)
	if err != nil {
		t.Fatal(err)
	}
	// (Unless leadership moved just before the hang: then the hung node
	// was a follower, which stalls nobody.)
	fired, follower := false, false
	for _, e := range events {
		if e.Kind == kindHeal && e.Fault == faultDiskHang {
			fired = fired || strings.Contains(e.Detail, "watchdog fired")
			follower = follower || strings.Contains(e.Detail, "not the leader")
		}
	}
	if !fired && !follower {
		t.Errorf("%s: no heal event says the watchdog fired", faultDiskHang)
	}
}

// Acceptance 2: Go workers that ignore lease loss (and the register's
// rejections) are caught as unsafe overlaps within the short profile.
// Whether a run catches them depends on a lease being lost while a broken
// worker is inside its critical section and another holder writing then:
// caught 3 runs of 3 on an idle machine, but missed once beside a CPU
// burner (fewer grants, fewer chances). So up to three seeds are tried, and
// the test fails only when none of them catches the broken client.
//
// It tests the checker, not lockd: which transport the workers' client
// uses does not change what the checker must catch. So CI's second pass
// of the suite, with the session stream off (LOCKD_STREAM=off), skips its
// one to three chaos runs (up to 5 minutes of a CI that must stay under
// 30); TestShortProfile runs in both passes.
func TestShortProfileBrokenClient(t *testing.T) {
	if !lockdtest.Stream() {
		t.Skip("the checker's own test: it runs with the session stream on (see above)")
	}
	for seed := uint64(1); seed <= 3; seed++ {
		r := shortRun(t, brokenIgnoreLease, seed)
		if r.Overlaps.Unsafe > 0 && len(r.Violations) > 0 {
			t.Logf("broken client caught with seed %d: %d unsafe overlaps", seed, r.Overlaps.Unsafe)
			return
		}
		t.Logf("seed %d did not catch the broken client: overlaps %+v", seed, r.Overlaps)
	}
	t.Errorf("broken client not caught in 3 short profiles")
}

// The proxies cut what the partition table says: an isolated leader loses
// its followers, who elect another leader, and the old one rejoins after
// the heal. Also kill -9 and SIGSTOP of a node, as the nemeses do them.
func TestClusterPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes: skipped with -short")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := buildBinary(ctx, dir)
	if err != nil {
		if os.Getenv("CI") != "true" {
			t.Skipf("cannot build lockd: %v", err)
		}
		t.Fatal(err)
	}
	c, err := newCluster(bin, dir, 3, defaultTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer c.down()
	if err := c.up(ctx); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		old := c.leader(ctx)
		if old == nil {
			t.Fatal("no leader")
		}
		var others []*node
		for _, n := range c.nodes {
			if n != old {
				others = append(others, n)
			}
		}
		c.partition([]*node{old}, others, true)
		var seen string
		err := poll(ctx, 10*time.Second, 20*time.Millisecond, func() (bool, error) {
			st, err := status(ctx, others[0].url())
			seen = st.GetLeader()
			return err == nil && seen != "" && seen != old.id, nil
		})
		c.heal()
		if err != nil {
			t.Fatalf("round %d: %s isolated, the others still see leader %q: %v", round, old.id, seen, err)
		}
		t.Logf("round %d: %s isolated; the others elected %s", round, old.id, seen)
		if err := c.waitStable(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	checkWallOffset(ctx, t, c)
}

// checkWallOffset: the offset file node-clock-jump writes reaches the
// nodes' wall clock (a hold's granted-at time, which a busy TryLock
// reports, is the leader's wallclock.Now).
func checkWallOffset(ctx context.Context, t *testing.T, c *cluster) {
	for _, n := range c.nodes {
		if err := os.WriteFile(n.wall, []byte("-3h"), 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(n.wall)
	}
	cl, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(c.endpoints()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	var ms []*lockd.Mutex
	for range 2 {
		s, err := cl.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		ms = append(ms, s.NewMutex("chaos/wall"))
	}
	if err := ms[0].Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var busy *lockd.BusyError
	if err := ms[1].TryLock(ctx); !errors.As(err, &busy) || len(busy.Holders) != 1 {
		t.Fatalf("TryLock on a held lock: %v, want a BusyError with one holder", err)
	}
	if ago := time.Since(busy.Holders[0].GrantedAt); ago < 3*time.Hour-time.Minute || ago > 3*time.Hour+time.Minute {
		t.Errorf("granted %v ago with the nodes' wall clocks 3h behind, want about 3h", ago.Round(time.Second))
	}
}

// TestHelpListsFaults: `chaos --help` names every kind --faults accepts,
// on lockd and on the Redis backends, and each kind it names parses.
func TestHelpListsFaults(t *testing.T) {
	var out strings.Builder
	if code := Main(context.Background(), []string{"--help"}, io.Discard, &out); code != exitUsage {
		t.Fatalf("--help exited %d; want %d", code, exitUsage)
	}
	help := out.String()
	for _, k := range append(slices.Clone(allFaults), redisFaults...) {
		if !strings.Contains(help, k) {
			t.Errorf("--help does not list fault kind %q:\n%s", k, help)
		}
	}
	for _, k := range allFaults {
		if _, err := parseConfig([]string{"--nodes", "5", "--faults", k}, io.Discard); err != nil {
			t.Errorf("--faults %s: %v", k, err)
		}
	}
	for _, k := range redisFaults {
		if _, err := parseConfig([]string{"--backend", "redis", "--faults", k}, io.Discard); err != nil {
			t.Errorf("--backend redis --faults %s: %v", k, err)
		}
	}
}

// The leader SIGSTOPped for 7 s under the tool's clients: no violation, and the summary shows the longest stretch without a
// grant around the pause (a measurement here; the bound is asserted by
// cmd/lockd's TestClusterLeaderPause, under lockd run loops alone).
func TestLeaderPause(t *testing.T) {
	if testing.Short() {
		t.Skip("real-process chaos run: skipped with -short")
	}
	cfg := &config{Seed: 1, Backend: backendLockd, Profile: "short", Nodes: 3, Clients: 6, Locks: 2, Faults: []string{faultPauseLeader}, Out: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := run(ctx, cfg, &syncWriter{t: t})
	if err != nil && r == nil && strings.Contains(err.Error(), "go build") && os.Getenv("CI") != "true" {
		t.Skipf("cannot build lockd: %v", err)
	}
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	s := summary(r)
	t.Log(s)
	if len(r.Violations) != 0 || r.Faults[faultPauseLeader] != 1 {
		t.Fatalf("violations %v, faults %v; want none and one %s", r.Violations, r.Faults, faultPauseLeader)
	}
	if !strings.Contains(s, "leader-pause-gap=") {
		t.Errorf("summary without the leader pause's gap: %s", s)
	}
}
