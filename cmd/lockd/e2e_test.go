package main

// End-to-end tests of `lockd run` and the admin commands: real `lockd
// serve` and `lockd run` processes, built once in TestMain. They prove the
// CLI's promises: mutual exclusion with increasing tokens, a killed
// holder's lock handed over after the group is gone, lease loss ending the
// group in time when the server or lockd run itself is frozen, and a
// killed supervisor does not keep the lock. The helpers here (servers, runs, polling) serve every e2e file.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/proctest"

	"github.com/lockd-dev/lockd/internal/sectionlog"
	"golang.org/x/sys/unix"
)

var (
	lockdBin string // the built binary
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockdBin = filepath.Join(dir, "lockd")
	// A fuzzing run (and each of its workers, which run TestMain too)
	// needs no binary.
	flag.Parse()
	if fuzzing := flag.Lookup("test.fuzz"); fuzzing != nil && fuzzing.Value.String() != "" {
		buildErr = errors.New("not built while fuzzing")
	} else if fw := flag.Lookup("test.fuzzworker"); fw != nil && fw.Value.String() == "true" {
		buildErr = errors.New("not built in a fuzz worker")
	} else if out, err := exec.Command("go", "build", "-o", lockdBin, ".").CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build ./cmd/lockd: %v\n%s", err, out)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needBinary(t *testing.T) {
	t.Helper()
	if buildErr == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(buildErr)
	}
	t.Skipf("lockd binary not built (the server may not be ready yet): %v", buildErr)
}

// Server timing for the tests: short Raft timeouts, grace 100 ms.
const (
	testElection = 100 * time.Millisecond
	testGrace    = 100 * time.Millisecond
)

// lockdServer is a `lockd serve` process.
type lockdServer struct {
	cmd    *exec.Cmd
	url    string
	log    string
	exited chan struct{} // closed once the process has exited
}

// freePort returns a 127.0.0.1 address free now, for a server started
// later (proctest.FreePort).
func freePort(t *testing.T) string { return proctest.FreePort(t) }

// startServer starts `lockd serve` on a fresh data dir and free ports and
// waits until it is ready.
func startServer(t *testing.T) *lockdServer {
	t.Helper()
	needBinary(t)
	return startServerAt(t, filepath.Join(t.TempDir(), "data"), freePort(t), freePort(t))
}

// startServerAt starts `lockd serve` on the given data dir, API and Raft
// addresses (a restart passes the same ones again) and waits until it is
// ready (the established leader).
func startServerAt(t *testing.T, dataDir, api, raftAddr string) *lockdServer {
	t.Helper()
	return startNode(t, dataDir, api, raftAddr, "/readyz")
}

// startNode starts `lockd serve` with extra flags (--node-id, --join) and
// waits until readyPath answers 200: "/readyz" for the established leader,
// "/healthz" for any node that serves its API (a joining node does once it
// has joined).
func startNode(t *testing.T, dataDir, api, raftAddr, readyPath string, extra ...string) *lockdServer {
	t.Helper()
	needBinary(t)
	return startNodeBin(t, lockdBin, dataDir, api, raftAddr, readyPath, extra...)
}

// startNodeBin is startNode with the lockd binary bin.
func startNodeBin(t *testing.T, bin, dataDir, api, raftAddr, readyPath string, extra ...string) *lockdServer {
	t.Helper()
	s := &lockdServer{url: "http://" + api, log: filepath.Join(t.TempDir(), "server.log"), exited: make(chan struct{})}
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	s.cmd = exec.Command(bin, "serve",
		"--data-dir", dataDir,
		"--listen", api, "--raft-listen", raftAddr,
		"--heartbeat-timeout", testElection.String(),
		"--election-timeout", testElection.String(),
		"--grace", testGrace.String())
	s.cmd.Args = append(s.cmd.Args, extra...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			b, _ := os.ReadFile(s.log)
			t.Logf("server log (%s):\n%s", dataDir, b)
		}
	})
	hc := &http.Client{Timeout: time.Second}
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := hc.Get(s.url + readyPath)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(s.log)
			t.Fatalf("lockd serve exited: %s", b)
		case <-tick.C:
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("lockd serve not ready after 15s")
		}
	}
	return s
}

// runProc is a `lockd run` process.
type runProc struct {
	cmd    *exec.Cmd
	out    string
	done   chan struct{}
	exitAt time.Time
	err    error
}

func startRun(t *testing.T, s *lockdServer, args ...string) *runProc {
	t.Helper()
	return startRunAt(t, s.url, args...)
}

// startRunAt starts `lockd run` with LOCKD_ENDPOINTS=endpoints.
func startRunAt(t *testing.T, endpoints string, args ...string) *runProc {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "run-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &runProc{out: f.Name(), done: make(chan struct{})}
	p.cmd = exec.Command(lockdBin, append([]string{"run"}, args...)...)
	p.cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS="+endpoints)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		p.exitAt = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for lockd run to exit and returns its exit status.
func (p *runProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("lockd run still running after %v; output: %s", timeout, p.output())
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	t.Fatalf("lockd run: %v", p.err)
	return -1
}

func (p *runProc) output() string {
	b, _ := os.ReadFile(p.out)
	return strings.TrimSpace(string(b))
}

func alive(pid int) bool { return unix.Kill(pid, 0) != unix.ESRCH }

// poll calls cond every few milliseconds until it holds or timeout passes;
// it returns whether it held.
func poll(timeout time.Duration, cond func() bool) bool {
	end := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		<-tick.C
	}
	return true
}

// readFields polls file until it has at least n whitespace-separated fields.
func readFields(t *testing.T, file string, n int, timeout time.Duration) []string {
	t.Helper()
	var f []string
	if !poll(timeout, func() bool {
		b, _ := os.ReadFile(file)
		f = strings.Fields(string(b))
		return len(f) >= n
	}) {
		t.Fatalf("%s: got %q, want %d fields within %v", file, f, n, timeout)
	}
	return f
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Acceptance 1: 32 concurrent `lockd run` on one lock: no two critical
// sections overlap, and tokens strictly increase in grant order.
func TestRunMutualExclusion(t *testing.T) {
	s := startServer(t)
	dir := t.TempDir()
	logFile := filepath.Join(dir, "log")
	const n = 32
	script := `echo "start $LOCKD_TOKEN $LOCKD_SESSION" >> "$LOG"; sleep 0.02; echo "end $LOCKD_TOKEN $LOCKD_SESSION" >> "$LOG"`
	t.Setenv("LOG", logFile)
	start := time.Now()
	procs := make([]*runProc, n)
	for i := range procs {
		procs[i] = startRun(t, s, "--ttl", "10s", "acceptance-1", "--", "sh", "-c", script)
	}
	for i, p := range procs {
		if code := p.wait(t, 60*time.Second); code != 0 {
			t.Errorf("lockd run %d: exit status %d: %s", i, code, p.output())
		}
	}
	t.Logf("%d runs in %v", n, time.Since(start))
	checkLog(t, logFile, n)
	// lockd run's calls go over the session stream, unless LOCKD_STREAM=off.
	frames := scrapeMetric(t, s.url, `lockd_api_stream_frames_total{kind="acquire"}`)
	unary := scrapeMetric(t, s.url, `lockd_api_requests_total{code="ok",method="/lockd.v1.LockService/Acquire"}`)
	if os.Getenv("LOCKD_STREAM") == "off" {
		frames, unary = unary, frames
	}
	if frames < n || unary != 0 {
		t.Errorf("acquires: %v on the expected path, %v on the other (LOCKD_STREAM=%q)", frames, unary, os.Getenv("LOCKD_STREAM"))
	}
}

// scrapeMetric returns one sample of a server's /metrics (0 when absent).
func scrapeMetric(t *testing.T, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// checkLog verifies a log of "start TOKEN SESSION" / "end TOKEN SESSION"
// lines: every start followed by its own end before any other start, tokens
// strictly increasing, n sections.
func checkLog(t *testing.T, file string, n int) {
	t.Helper()
	got, err := sectionlog.Check(file, sectionlog.Format{Begin: "start", End: "end", Fields: 3, Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("got %d complete sections, want %d", got, n)
	}
}

// Acceptance 2: kill -9 of a `lockd run` holding a lock with TTL 2 s: the
// waiting `lockd run` gets the lock within TTL + grace + 1 s with a larger
// token, and the first child's group is dead before the second child starts.
func TestRunHolderKilled(t *testing.T) {
	s := startServer(t)
	dir := t.TempDir()
	const ttl = 2 * time.Second
	first := filepath.Join(dir, "first")
	second := filepath.Join(dir, "second")
	// The first child ignores SIGTERM, so only the supervisor's SIGKILL ends
	// it and its grandchild.
	holder := startRun(t, s, "--ttl", ttl.String(), "acceptance-2", "--", "sh", "-c",
		`trap "" TERM; sleep 1000 & echo $$ $! $LOCKD_TOKEN > "`+first+`"; wait`)
	f := readFields(t, first, 3, 10*time.Second)
	pgid, grandchild, token1 := atoi(t, f[0]), atoi(t, f[1]), f[2]

	// The second child checks that the first group is gone before anything
	// else (kill -0 -PGID fails), and records its token.
	waiter := startRun(t, s, "--ttl", ttl.String(), "acceptance-2", "--", "sh", "-c",
		fmt.Sprintf(`if kill -0 -%d 2>/dev/null; then gone=ALIVE; else gone=gone; fi; echo $LOCKD_TOKEN $gone > "%s"`, pgid, second))
	// Let the waiter queue behind the holder.
	if !poll(10*time.Second, func() bool {
		d := describe(t, s, "acceptance-2")
		return d != nil && len(d.Waiters) > 0
	}) {
		t.Fatalf("the second lockd run did not queue: %s", waiter.output())
	}

	killed := time.Now()
	if err := holder.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	bound := ttl + testGrace + time.Second
	f = readFields(t, second, 2, bound+5*time.Second)
	got := time.Since(killed)
	t.Logf("waiter's child started %v after kill -9 of the holder (bound TTL+grace+1s = %v)", got, bound)
	if got > bound {
		t.Errorf("waiter got the lock %v after the kill, want within %v", got, bound)
	}
	if f[1] != "gone" {
		t.Errorf("the first child's process group %d was alive when the second child started", pgid)
	}
	t1, _ := strconv.ParseUint(token1, 10, 64)
	t2, _ := strconv.ParseUint(f[0], 10, 64)
	if t2 <= t1 {
		t.Errorf("second token %d, want above the first %d", t2, t1)
	}
	if alive(-pgid) || alive(grandchild) {
		t.Errorf("first child's group %d or grandchild %d still alive", pgid, grandchild)
	}
	if code := waiter.wait(t, 10*time.Second); code != 0 {
		t.Errorf("waiter: exit status %d: %s", code, waiter.output())
	}
}

// Acceptance 4: lease loss. Freeze the server (SIGSTOP) under a `lockd
// run` holding a lock with TTL 2 s: no later than TTL·0.99 − margin after
// the SIGSTOP, every process of the child's group is dead and lockd run has
// exited 71. Freeze lockd run itself instead: its child's group is dead by
// the same time.
func TestRunLeaseLoss(t *testing.T) {
	const ttl = 2 * time.Second
	margin := max(100*time.Millisecond, ttl/50)
	bound := time.Duration(float64(ttl)*0.99) - margin
	scripts := map[string]string{
		"term":         `sleep 1000 & echo $$ $! > "$PIDS"; wait`,
		"term ignored": `trap "" TERM; sleep 1000 & echo $$ $! > "$PIDS"; wait`,
	}
	for _, freeze := range []string{"server", "lockd run"} {
		for _, name := range []string{"term", "term ignored"} {
			t.Run(freeze+"/"+name, func(t *testing.T) {
				s := startServer(t)
				pids := filepath.Join(t.TempDir(), "pids")
				t.Setenv("PIDS", pids)
				p := startRun(t, s, "--ttl", ttl.String(), "acceptance-4", "--", "sh", "-c", scripts[name])
				f := readFields(t, pids, 2, 10*time.Second)
				pgid, grandchild := atoi(t, f[0]), atoi(t, f[1])
				target := s.cmd.Process
				if freeze == "lockd run" {
					target = p.cmd.Process
				}
				frozen := time.Now()
				if err := target.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				var gone time.Duration
				if !poll(bound+3*time.Second, func() bool { return !alive(-pgid) && !alive(grandchild) }) {
					t.Fatalf("child's group %d still alive %v after freezing %s", pgid, time.Since(frozen), freeze)
				}
				gone = time.Since(frozen)
				t.Logf("group gone %v after SIGSTOP of %s (bound TTL·0.99 − margin = %v)", gone, freeze, bound)
				if gone > bound {
					t.Errorf("group gone %v after the freeze, want within %v", gone, bound)
				}

				if freeze == "lockd run" {
					_ = target.Signal(syscall.SIGCONT)
				}
				code := p.wait(t, bound+5*time.Second)
				if freeze == "server" {
					exited := p.exitAt.Sub(frozen)
					t.Logf("lockd run exited %d, %v after SIGSTOP of the server", code, exited)
					if exited > bound {
						t.Errorf("lockd run exited %v after the freeze, want within %v", exited, bound)
					}
				}
				if code != exitStopped {
					t.Errorf("lockd run: exit status %d, want %d; output: %s", code, exitStopped, p.output())
				}
				t.Logf("lockd run said: %s", p.output())
			})
		}
	}
}

// Exit statuses and messages of lockd run against a live server.
func TestRunExitStatus(t *testing.T) {
	s := startServer(t)
	// Hold a lock for the conflict cases.
	holder := startRun(t, s, "held", "--", "sleep", "1000")
	if !poll(10*time.Second, func() bool {
		out, _ := exec.Command(lockdBin, "ls", "--endpoints", s.url).Output()
		return strings.Contains(string(out), "held")
	}) {
		t.Fatalf("holder did not get the lock: %s", holder.output())
	}
	tests := []struct {
		name string
		args []string
		want int
		msg  string // in stderr; "" for the command's own status
	}{
		{"child status", []string{"free", "--", "sh", "-c", "exit 3"}, 3, ""},
		{"child signal", []string{"free", "--", "sh", "-c", "kill -KILL $$"}, 137, ""},
		{"env", []string{"envtest", "--", "sh", "-c", `test "$LOCKD_LOCK" = envtest && test -n "$LOCKD_SESSION" && test "$LOCKD_TOKEN" -gt 0`}, 0, ""},
		{"no-wait busy", []string{"--no-wait", "held", "--", "true"}, exitConflict, "busy"},
		{"wait 0 busy", []string{"--wait", "0", "held", "--", "true"}, exitConflict, "busy"},
		{"wait runs out", []string{"--wait", "300ms", "held", "--", "true"}, exitConflict, "within --wait"},
		{"conflict exit code", []string{"--no-wait", "--conflict-exit-code", "9", "held", "--", "true"}, 9, "busy"},
		{"not found", []string{"free", "--", "/nonexistent/lockd-test"}, 127, "cannot run"},
		{"not executable", []string{"free", "--", "/dev/null"}, 126, "cannot run"},
		{"max-hold", []string{"--max-hold", "200ms", "free", "--", "sleep", "1000"}, exitStopped, "--max-hold"},
		{"bad name", []string{"", "--", "true"}, exitUsage, "invalid"},
		{"ttl out of bounds", []string{"--ttl", "2h", "free", "--", "true"}, exitUsage, "ttl"},
		{"usage", []string{"free"}, exitUsage, "usage"},
		{"limit mismatch", []string{"--limit", "3", "held", "--", "true"}, exitUsage, "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startRun(t, s, tt.args...)
			code := p.wait(t, 20*time.Second)
			out := p.output()
			if code != tt.want {
				t.Errorf("exit status %d, want %d; output: %s", code, tt.want, out)
			}
			if tt.msg == "" && out != "" {
				t.Errorf("output %q, want none", out)
			}
			if tt.msg != "" && (!strings.Contains(out, tt.msg) || strings.Count(out, "\n") > 0) {
				t.Errorf("output %q, want one line containing %q", out, tt.msg)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		p := startRun(t, &lockdServer{url: "http://" + freePort(t)}, "--wait", "1s", "x", "--", "true")
		if code := p.wait(t, 20*time.Second); code != exitUnavailable {
			t.Errorf("exit status %d, want %d; output: %s", code, exitUnavailable, p.output())
		}
	})
	t.Run("forwarded signal", func(t *testing.T) {
		ready := filepath.Join(t.TempDir(), "ready")
		p := startRun(t, s, "sig", "--", "sh", "-c", `trap 'exit 42' TERM; echo up > "`+ready+`"; sleep 1000 & wait`)
		readFields(t, ready, 1, 10*time.Second)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.wait(t, 10*time.Second); code != 42 {
			t.Errorf("exit status %d, want the child's 42; output: %s", code, p.output())
		}
		// The lock was released after the group ended.
		q := startRun(t, s, "--no-wait", "sig", "--", "true")
		if code := q.wait(t, 10*time.Second); code != 0 {
			t.Errorf("lock not released: exit status %d: %s", code, q.output())
		}
	})
}

// TestRunOnce: `lockd run --once D` runs the job the first time, marks it
// done after exit 0, and a later run exits 0 without running it; a failed
// run does not mark it.
func TestRunOnce(t *testing.T) {
	s := startServer(t)
	marker := filepath.Join(t.TempDir(), "ran")
	job := []string{"--once", "1h", "invoices/2026-11", "--", "sh", "-c", "echo $LOCKD_TOKEN >> " + marker}
	if p := startRun(t, s, job...); p.wait(t, 20*time.Second) != 0 {
		t.Fatalf("first run: %s", p.output())
	}
	p := startRun(t, s, job...)
	if code := p.wait(t, 20*time.Second); code != 0 || !strings.Contains(p.output(), "already done") {
		t.Fatalf("second run: exit %d, %q; want 0 and an 'already done' line", code, p.output())
	}
	b, err := os.ReadFile(marker)
	if err != nil || len(strings.Fields(string(b))) != 1 {
		t.Fatalf("the job ran %d times (%q), want once", len(strings.Fields(string(b))), b)
	}
	// A failing run leaves no mark: the next one runs the job.
	if p := startRun(t, s, "--once", "1h", "reports/daily", "--", "false"); p.wait(t, 20*time.Second) != 1 {
		t.Fatalf("failing run: %s", p.output())
	}
	if p := startRun(t, s, "--once", "1h", "reports/daily", "--", "true"); p.wait(t, 20*time.Second) != 0 || strings.Contains(p.output(), "already done") {
		t.Fatalf("run after a failed one: %s", p.output())
	}
	if p := startRun(t, s, "--once", "1h", "--shared", "x", "--", "true"); p.wait(t, 20*time.Second) != exitUsage {
		t.Fatalf("--once --shared: %s", p.output())
	}
}

// The admin commands against a live server, in text and JSON.
func TestAdminCommands(t *testing.T) {
	s := startServer(t)
	holder := startRun(t, s, "--ttl", "2s", "admin/a", "--", "sleep", "1000")
	var mu sync.Mutex
	run := func(args ...string) (string, int) {
		mu.Lock()
		defer mu.Unlock()
		cmd := exec.Command(lockdBin, args...)
		cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS="+s.url)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		return string(out), 0
	}
	if !poll(10*time.Second, func() bool { out, _ := run("ls", "admin/"); return strings.Contains(out, "admin/a") }) {
		t.Fatalf("holder did not get the lock: %s", holder.output())
	}
	for _, tt := range []struct {
		args []string
		want []string
		code int
	}{
		{[]string{"ls", "admin/", "--json"}, []string{`"name": "admin/a"`, `"token": "`}, 0},
		{[]string{"ls", "nomatch/"}, nil, 0},
		{[]string{"describe", "admin/a"}, []string{"holders (1)", "exclusive"}, 0},
		{[]string{"describe", "--json", "admin/a"}, []string{`"mode": "MODE_EXCLUSIVE"`}, 0},
		{[]string{"describe", "admin/free"}, []string{"is free"}, 0},
		{[]string{"sessions"}, []string{"SESSION", "2s"}, 0},
		{[]string{"sessions", "--json"}, []string{`"sessionId"`}, 0},
		{[]string{"status"}, []string{"leader:", "applied index:"}, 0},
		{[]string{"status", "--json"}, []string{`"nodeId"`, `"lastToken": "`}, 0},
		{[]string{"version"}, []string{"lockd "}, 0},
		{[]string{"release", "admin/a"}, []string{"--force"}, exitUsage},
		{[]string{"describe"}, []string{"usage"}, exitUsage},
		{[]string{"nosuchcommand"}, []string{"unknown command"}, exitUsage},
	} {
		out, code := run(tt.args...)
		if code != tt.code {
			t.Errorf("lockd %s: exit status %d, want %d; output: %s", strings.Join(tt.args, " "), code, tt.code, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("lockd %s: output %q, want it to contain %q", strings.Join(tt.args, " "), out, w)
			}
		}
	}
	// A dead endpoint: unavailable (69). The message names the cause the
	// client saw last: "unavailable" with the refused connection, or only
	// the deadline when a loaded machine spent the whole second on the
	// first attempt.
	if out, code := run("status", "--timeout", "1s", "--endpoints", "127.0.0.1:1"); code != exitUnavailable ||
		!strings.Contains(out, "unavailable") && !strings.Contains(out, "deadline exceeded") {
		t.Errorf("lockd status against a dead endpoint: exit status %d, output %q; want %d, unavailable", code, out, exitUnavailable)
	}

	// Force-release revokes the holder's session: its lockd run stops the
	// command (exit 71) and the lock is free again after TTL + grace.
	out, code := run("release", "--force", "admin/a")
	if code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("release --force: exit status %d: %s", code, out)
	}
	if code := holder.wait(t, 10*time.Second); code != exitStopped {
		t.Errorf("holder after force-release: exit status %d, want %d: %s", code, exitStopped, holder.output())
	}
	t.Logf("holder said: %s", holder.output())
	next := startRun(t, s, "--ttl", "2s", "admin/a", "--", "true")
	if code := next.wait(t, 10*time.Second); code != 0 {
		t.Errorf("lock not granted again after force-release: exit status %d: %s", code, next.output())
	}
}

// childrenOf returns the pids of pid's direct children, from
// /proc/PID/task/*/children.
func childrenOf(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// Kill -9 of the supervisor alone (not of lockd run, not
// of the command's group). lockd run inherits the command's dead processes
// as their subreaper; it must reap them, not wait on their zombies forever:
// the group is dead and reaped, lockd run exits 71 within a second or two,
// the lock is released and a waiter gets it.
func TestRunSupervisorKilled(t *testing.T) {
	s := startServer(t)
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	second := filepath.Join(dir, "second")
	// The command ignores SIGTERM and leaves a grandchild in its group.
	holder := startRun(t, s, "--ttl", "10s", "supervisor-killed", "--", "sh", "-c",
		`trap "" TERM; sleep 1000 & echo $$ $! > "`+pids+`"; wait`)
	f := readFields(t, pids, 2, 10*time.Second)
	pgid, grandchild := atoi(t, f[0]), atoi(t, f[1])
	waiter := startRun(t, s, "--ttl", "10s", "supervisor-killed", "--", "sh", "-c", `echo $LOCKD_TOKEN > "`+second+`"`)
	if !poll(10*time.Second, func() bool {
		d := describe(t, s, "supervisor-killed")
		return d != nil && len(d.Waiters) > 0
	}) {
		t.Fatalf("the second lockd run did not queue: %s", waiter.output())
	}

	// lockd run's only child is the supervisor; the command is its child.
	var sup int
	for _, c := range childrenOf(holder.cmd.Process.Pid) {
		if c != pgid && c != grandchild {
			sup = c
		}
	}
	if sup == 0 {
		t.Fatalf("no supervisor among lockd run's children %v", childrenOf(holder.cmd.Process.Pid))
	}
	killed := time.Now()
	if err := unix.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	const bound = 2 * time.Second
	select {
	case <-holder.done:
	case <-time.After(bound + 3*time.Second):
		// Show what is left, then end it so the test does not hang.
		t.Errorf("lockd run still running %v after kill -9 of its supervisor; its children: %v", time.Since(killed), childrenOf(holder.cmd.Process.Pid))
		_ = holder.cmd.Process.Kill()
	}
	code := holder.wait(t, 5*time.Second)
	exited := holder.exitAt.Sub(killed)
	t.Logf("lockd run exited %d, %v after kill -9 of its supervisor: %s", code, exited, holder.output())
	if code != exitStopped {
		t.Errorf("lockd run: exit status %d, want %d", code, exitStopped)
	}
	if exited > bound {
		t.Errorf("lockd run exited %v after the kill, want within %v", exited, bound)
	}
	if alive(-pgid) || alive(grandchild) {
		t.Errorf("the command's group %d or grandchild %d still exists (alive or unreaped)", pgid, grandchild)
	}
	f = readFields(t, second, 1, 5*time.Second)
	t.Logf("waiter got the lock (token %s) %v after the kill", f[0], time.Since(killed))
	if code := waiter.wait(t, 10*time.Second); code != 0 {
		t.Errorf("waiter: exit status %d: %s", code, waiter.output())
	}
}
