package main

import (
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for the chaos binary: the tool
// re-executes itself (os.Executable) as Go worker and as `lockd run`
// child.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "worker" || os.Args[1] == "write") {
		os.Exit(Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
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
func shortRun(t *testing.T, broken string) *Report {
	t.Helper()
	if testing.Short() {
		t.Skip("real-process chaos run: skipped with -short")
	}
	cfg := &config{Seed: 1, Profile: "short", Nodes: 3, Clients: 6, Locks: 2, Broken: broken, Out: t.TempDir()}
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
	r := shortRun(t, "")
	if len(r.Violations) != 0 {
		t.Errorf("violations on a correct lockd:\n%s", strings.Join(r.Violations, "\n"))
	}
	for _, kind := range allFaults {
		if r.Faults[kind] != 1 {
			t.Errorf("fault %s injected %d times, want 1 (faults %v)", kind, r.Faults[kind], r.Faults)
		}
	}
	if r.Ops.Acquired < 50 || r.Ops.Runs < 100 || r.Linear != "ok" {
		t.Errorf("operations %+v, linearizable %s; want some load, checked", r.Ops, r.Linear)
	}
}

// Acceptance 2: Go workers that ignore lease loss (and the register's
// rejections) are caught as unsafe overlaps within the short profile.
func TestShortProfileBrokenClient(t *testing.T) {
	r := shortRun(t, brokenIgnoreLease)
	if r.Overlaps.Unsafe == 0 || len(r.Violations) == 0 {
		t.Errorf("broken client not caught: overlaps %+v, violations %q", r.Overlaps, r.Violations)
	}
}
