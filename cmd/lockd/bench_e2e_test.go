package main

// End-to-end tests of `lockd bench` against a real `lockd serve`, each
// workload for about a second, in process (for -race) and as the binary
// (for its output and exit statuses). They check that the
// report is sane, never how fast anything was.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/loadgen"
)

// runBench runs `lockd bench --json` with args in this process (so that
// -race covers the load generator) and decodes its report.
func runBench(t *testing.T, args ...string) *loadgen.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	m := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: streamEnvOnly}
	if err := m.Run(ctx, append([]string{"bench", "--json"}, args...)); err != nil {
		t.Fatalf("lockd bench %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr.String())
	}
	var r loadgen.Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("decode report: %v\n%s", err, stdout.String())
	}
	return &r
}

func TestBenchWorkloads(t *testing.T) {
	s := startServer(t)
	tests := []struct {
		workload string
		clients  int
		extra    []string
	}{
		{workload: loadgen.Own, clients: 3},
		{workload: loadgen.One, clients: 3},
		{workload: loadgen.Handoff, clients: 2},
		{workload: loadgen.Sessions, clients: 2, extra: []string{"--sessions", "40", "--ttl", "2s"}},
	}
	for _, tt := range tests {
		t.Run(tt.workload, func(t *testing.T) {
			args := append([]string{"--endpoints", s.url, "--workload", tt.workload,
				"--clients", strconv.Itoa(tt.clients), "--duration", "1s", "--warmup", "200ms"}, tt.extra...)
			r := runBench(t, args...)
			checkReport(t, r, tt.workload, tt.clients)
			if tt.workload == loadgen.Sessions {
				st := r.Sessions
				if st == nil {
					t.Fatal("sessions workload: no sessions section")
				}
				if st.Created != 40 || st.Requested != 40 || st.CreateErrors != 0 || st.Lost != 0 {
					t.Errorf("sessions: got %+v, want 40 of 40 created, no errors, none lost", *st)
				}
			}
		})
	}
}

// checkReport checks what holds of any sane report.
func checkReport(t *testing.T, r *loadgen.Report, workload string, clients int) {
	t.Helper()
	if r.System != "lockd" || r.Workload != workload || r.Clients != clients {
		t.Errorf("header: got system %q workload %q clients %d, want lockd %s %d", r.System, r.Workload, r.Clients, workload, clients)
	}
	if r.Ops <= 0 || r.OpsPerSecond <= 0 {
		t.Errorf("ops: got %d (%.1f/s), want some", r.Ops, r.OpsPerSecond)
	}
	if r.ErrorCount != 0 || len(r.Errors) != 0 {
		t.Errorf("errors: got %d %v (%v), want none", r.ErrorCount, r.Errors, r.ErrorSamples)
	}
	l := r.LatencyMicros
	if l.Count != r.Ops || l.P50 <= 0 || l.P50 > l.P90 || l.P90 > l.P99 || l.P99 > l.Max {
		t.Errorf("latency: got %+v for %d ops, want count = ops and 0 < p50 <= p90 <= p99 <= max", l, r.Ops)
	}
	if r.Seconds <= 0 || r.Seconds > 1.001 {
		t.Errorf("window: got %.3fs, want (0, 1s]", r.Seconds)
	}
	if r.ConnsOpened < 0 || r.ConnsTotal < r.ConnsOpened || r.ConnsTotal < int64(clients) {
		t.Errorf("connections: got %d in the window, %d in all, want 0 <= window <= all and at least one per client",
			r.ConnsOpened, r.ConnsTotal)
	}
	if r.ClientCPUSeconds <= 0 || r.ClientMaxRSSBytes <= 0 {
		t.Errorf("client: got cpu %.3fs, max rss %d, want both positive", r.ClientCPUSeconds, r.ClientMaxRSSBytes)
	}
	contended := workload == loadgen.One || workload == loadgen.Handoff
	switch {
	case contended && r.Fairness == nil:
		t.Errorf("fairness: missing for %s", workload)
	case contended && (*r.Fairness < 0 || *r.Fairness > 1):
		t.Errorf("fairness: got %v, want in [0, 1]", *r.Fairness)
	case contended && len(r.PerWorkerOps) != clients:
		t.Errorf("per-worker ops: got %v, want %d counts", r.PerWorkerOps, clients)
	case !contended && r.Fairness != nil:
		t.Errorf("fairness: got %v for %s, want none", *r.Fairness, workload)
	}
	if contended {
		var sum int64
		for _, n := range r.PerWorkerOps {
			sum += n
		}
		if sum != r.Ops {
			t.Errorf("per-worker ops %v sum to %d, want ops %d", r.PerWorkerOps, sum, r.Ops)
		}
	}
}

// TestBenchTable checks the table output, that a bad flag is a usage
// error (exit status 64) before any load starts, and that an unreachable
// cluster is exit status 69.
func TestBenchTable(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, lockdBin, "bench", "--endpoints", s.url, "--workload", "own",
		"--clients", "2", "--duration", "300ms", "--warmup", "0s").CombinedOutput()
	if err != nil {
		t.Fatalf("lockd bench: %v\n%s", err, out)
	}
	for _, want := range []string{"workload", "ops", "latency", "p99", "errors", "connections", "client cpu"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{
		{"--workload", "nope"},
		{"--workload", "one", "--clients", "1"},
		{"--endpoints", "ftp://x"},
		{"extra-arg"},
	} {
		err := exec.CommandContext(ctx, lockdBin, append([]string{"bench", "--duration", "1s"}, args...)...).Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
			t.Errorf("lockd bench %v: got %v, want exit status %d", args, err, exitUsage)
		}
	}
	// No server: the sessions cannot be opened, exit status 69.
	err = exec.CommandContext(ctx, lockdBin, "bench", "--endpoints", freePort(t), "--clients", "2",
		"--timeout", "1s", "--duration", "1s").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUnavailable {
		t.Errorf("lockd bench with no server: got %v, want exit status %d", err, exitUnavailable)
	}
}

// TestBenchListLocks runs the listlocks scenario briefly against a real
// server: the locks are held, the readers' pages return locks on the held
// prefix and none on the other (and no reader runs in the idle phase),
// every phase measures the good client, and nothing fails. How fast is for the benchmark (bench/listlocks.sh).
func TestBenchListLocks(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	m := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: streamEnvOnly}
	args := []string{"bench", "--json", "--endpoints", s.url, "--workload", "listlocks", "--locks", "300",
		"--readers", "2", "--reader-rate", "50", "--rounds", "2", "--duration", "300ms", "--warmup", "100ms"}
	if err := m.Run(ctx, args); err != nil {
		t.Fatalf("lockd %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr.String())
	}
	var r listReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("decode report: %v\n%s", err, stdout.String())
	}
	if r.Workload != "listlocks" || r.Locks != 300 || r.Readers != 2 || r.Rounds != 2 || len(r.RoundRatios) != 2 {
		t.Errorf("header: got %+v", r)
	}
	for _, ph := range []struct {
		name   string
		p      listPhase
		listed bool
	}{{"match", r.Match, true}, {"none", r.None, false}, {"idle", r.Idle, false}} {
		p := ph.p
		if p.Good.Count <= 0 || (p.Reader.Count <= 0) != (ph.name == "idle") || p.Good.P50 <= 0 || p.Good.P50 > p.Good.P99 || len(p.RoundP99) != 2 {
			t.Errorf("%s: got good %+v readers %+v rounds %v, want calls measured", ph.name, p.Good, p.Reader, p.RoundP99)
		}
		if p.Errors != 0 {
			t.Errorf("%s: %d errors (%s)", ph.name, p.Errors, p.ErrorSample)
		}
		if (p.Listed > 0) != ph.listed {
			t.Errorf("%s: prefix %q listed %d locks, want some: %v", ph.name, p.Prefix, p.Listed, ph.listed)
		}
	}
	// Bad settings are usage errors before any load.
	for _, bad := range [][]string{{"--readers", "0"}, {"--page-size", "1001"}, {"--locks", "-1"}, {"--rounds", "0"}} {
		err := (&Main{Stdout: io.Discard, Stderr: io.Discard, Getenv: streamEnvOnly}).Run(ctx,
			append([]string{"bench", "--endpoints", s.url, "--workload", "listlocks"}, bad...))
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("listlocks %v: got %v, want a usage error", bad, err)
		}
	}
}
