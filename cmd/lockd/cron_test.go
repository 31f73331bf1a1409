package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCronParse(t *testing.T) {
	// LOCKD_TEST_CLOCK_OFFSET is read only by a lockdfault build
	// (clockhook_*.go): this one ignores it.
	getenv := func(k string) string {
		if k == "LOCKD_TEST_CLOCK_OFFSET" {
			return "-8s"
		}
		return ""
	}
	c := &CronCommand{Stderr: io.Discard, Getenv: getenv}
	f, err := c.parse([]string{"--tz", "Europe/Paris", "--catch-up", "30s", "--ttl", "4s", "0 9 * * 1-5", "invoices", "--", "sh", "-c", "exit 0"})
	if err != nil {
		t.Fatal(err)
	}
	if f.schedule.Location().String() != "Europe/Paris" || f.catchUp != 30*time.Second || f.run.ttl != 4*time.Second ||
		f.run.killGrace != time.Second || f.run.name != "invoices" || strings.Join(f.run.command, " ") != "sh -c exit 0" || f.offset != wantOffset(-8*time.Second) {
		t.Errorf("parsed %+v", f)
	}
	// The defaults: a late start catches up within the hour, and only a
	// fleet with a record of an earlier run.
	if f, err := c.parse([]string{"@monthly", "invoices", "--", "true"}); err != nil || f.catchUp != time.Hour || f.catchFirst {
		t.Errorf("defaults: %+v, %v; want --catch-up 1h, no --catch-up-first", f, err)
	}
	if f, err := c.parse([]string{"--catch-up-first", "@monthly", "invoices", "--", "true"}); err != nil || !f.catchFirst {
		t.Errorf("--catch-up-first: %+v, %v", f, err)
	}
	for _, args := range [][]string{
		{"* * * * *", "job"},                  // no command
		{"* * * * *", "--", "true"},           // no name
		{"* * * * *", "a", "b", "--", "true"}, // extra argument
		{"* * * *", "job", "--", "true"},      // 4 fields
		{"@every 1m", "job", "--", "true"},    // no fixed periods
		{"* * * * *", "a@b", "--", "true"},    // '@' is the period separator
		{"--tz", "Mars/Base", "* * * * *", "job", "--", "true"},
		{"--retry-delay", "0s", "* * * * *", "job", "--", "true"},
		{"--catch-up", "-1s", "* * * * *", "job", "--", "true"},
		{"--kill-grace", "6s", "* * * * *", "job", "--", "true"}, // more than TTL/2
		{"--bogus", "* * * * *", "job", "--", "true"},
	} {
		var ue usageError
		if _, err := c.parse(args); !errors.As(err, &ue) {
			t.Errorf("parse %q: got %v, want a usage error", args, err)
		}
	}
}

func TestCronHelp(t *testing.T) {
	var stderr bytes.Buffer
	m := &Main{Stdout: io.Discard, Stderr: &stderr, Getenv: streamEnvOnly}
	if code := m.exitStatus(m.Run(context.Background(), []string{"cron", "-h"})); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	for _, want := range []string{"lockd cron [flags] 'SCHEDULE' NAME -- CMD", "-catch-up", "-catch-up-first", "(default 1h0m0s)", "-retry-delay", "-tz", "NAME@START", "docs/cron.md"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("lockd cron -h: missing %q in\n%s", want, stderr.String())
		}
	}
}

// startCron starts `lockd cron` against s with extra environment.
func startCron(t *testing.T, s *lockdServer, env []string, args ...string) (*exec.Cmd, string, chan error) {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), "cron.log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(lockdBin, append([]string{"cron"}, args...)...)
	cmd.Env = append(append(os.Environ(), "LOCKD_ENDPOINTS="+s.url), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	exited := make(chan struct{}) // closed on exit, even once the test read done
	go func() { done <- cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
	})
	return cmd, logFile, done
}

// A server that starts inside a period catches it up at once; SIGTERM is
// forwarded to the running job, whose exit 0 marks the period done, and
// lockd cron exits 0; a second server then finds the period done.
func TestCronStopAndDone(t *testing.T) {
	s := startServer(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	// A yearly schedule: the current period is open for the whole test.
	job := `echo start >> "$OUT"; trap 'echo term >> "$OUT"; exit 0' TERM; sleep 30 & wait`
	// It began before the server started: catching it up needs a window
	// as long as the period and --catch-up-first on a fresh cluster.
	args := []string{"--ttl", "3s", "--catch-up", "0", "--catch-up-first", "0 0 1 1 *", "report", "--", "sh", "-c", job}
	env := []string{"OUT=" + out}
	cmd, logA, done := startCron(t, s, env, args...)
	if !poll(10*time.Second, func() bool { b, _ := os.ReadFile(out); return string(b) == "start\n" }) {
		b, _ := os.ReadFile(logA)
		t.Fatalf("job not started within 10s; log:\n%s", b)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			b, _ := os.ReadFile(logA)
			t.Fatalf("lockd cron after SIGTERM: %v, want exit 0; log:\n%s", err, b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lockd cron still running 10s after SIGTERM")
	}
	if b, _ := os.ReadFile(out); string(b) != "start\nterm\n" {
		t.Errorf("job output %q, want start then term", b)
	}

	cmd, logB, done := startCron(t, s, env, args...)
	if !poll(10*time.Second, func() bool { b, _ := os.ReadFile(logB); return strings.Contains(string(b), "period already done") }) {
		b, _ := os.ReadFile(logB)
		t.Fatalf("second server: no \"period already done\" within 10s; log:\n%s", b)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Errorf("second lockd cron after SIGTERM: %v", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "start\nterm\n" {
		t.Errorf("job ran again: output %q", b)
	}
}

// A server that starts after the window
// (default --catch-up 1h; the yearly period began long before) while
// another runs the period joins it as a standby, and runs the job when
// that run fails; the first server's retry then finds the period done.
func TestCronJoinAfterWindow(t *testing.T) {
	s := startServer(t)
	dir := t.TempDir()
	out, fail := filepath.Join(dir, "out"), filepath.Join(dir, "fail")
	// Server a's run lasts until the test creates $FAIL, then fails;
	// server b's succeeds at once.
	job := []string{"0 0 1 1 *", "report", "--", "sh", "-c",
		`echo "run-$ID" >> "$OUT"; [ "$ID" = b ] && exit 0; while [ ! -e "$FAIL" ]; do sleep 0.1; done; exit 1`}
	env := func(id string) []string { return []string{"OUT=" + out, "FAIL=" + fail, "ID=" + id} }
	// The runner: it catches up the period under way (a first start).
	cmdA, logA, doneA := startCron(t, s, env("a"), append([]string{"--catch-up", "0", "--catch-up-first", "--retry-delay", "2s"}, job...)...)
	t.Cleanup(func() { _ = os.WriteFile(fail, nil, 0o644) }) // a's job ends even if the test stops early
	if !poll(10*time.Second, func() bool { b, _ := os.ReadFile(out); return string(b) == "run-a\n" }) {
		b, _ := os.ReadFile(logA)
		t.Fatalf("server a: job not started within 10s; log:\n%s", b)
	}
	cmdB, logB, doneB := startCron(t, s, env("b"), job...)
	if !poll(10*time.Second, func() bool {
		b, _ := os.ReadFile(logB)
		return strings.Contains(string(b), "period joined after its window")
	}) {
		b, _ := os.ReadFile(logB)
		t.Fatalf("server b: no \"period joined after its window\" within 10s; log:\n%s", b)
	}
	if err := os.WriteFile(fail, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if !poll(15*time.Second, func() bool {
		b, _ := os.ReadFile(logB)
		return strings.Contains(string(b), "job succeeded: period done")
	}) {
		b, _ := os.ReadFile(logB)
		t.Fatalf("server b: did not take over within 15s; log:\n%s", b)
	}
	if !poll(15*time.Second, func() bool { b, _ := os.ReadFile(logA); return strings.Contains(string(b), "period already done") }) {
		b, _ := os.ReadFile(logA)
		t.Fatalf("server a: its retry did not find the period done within 15s; log:\n%s", b)
	}
	for _, c := range []struct {
		cmd  *exec.Cmd
		done chan error
	}{{cmdA, doneA}, {cmdB, doneB}} {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		if err := <-c.done; err != nil {
			t.Errorf("lockd cron after SIGTERM: %v", err)
		}
	}
	if b, _ := os.ReadFile(out); string(b) != "run-a\nrun-b\n" {
		t.Errorf("job output %q, want a's failed run then b's", b)
	}
}
