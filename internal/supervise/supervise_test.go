package supervise_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockd-dev/lockd/internal/supervise"
)

// The test binary doubles as the supervisor (supervise.Start re-executes
// this executable with supervise.Command) and as a stand-in for lockd run
// that can be killed with -9 (testParent).
const testParent = "__testparent"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case supervise.Command:
			os.Exit(supervise.Main(os.Args[2:]))
		case testParent:
			os.Exit(runTestParent(os.Args[2:]))
		}
	}
	os.Exit(m.Run())
}

// runTestParent supervises args with a far deadline, prints the command's
// pid on stderr and waits.
func runTestParent(args []string) int {
	p, err := supervise.Start(supervise.Config{
		Command:   args,
		Deadline:  time.Now().Add(time.Hour),
		KillGrace: 300 * time.Millisecond,
		Stdout:    os.Stdout,
		Stderr:    os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "pid %d\n", p.Pid())
	r, err := p.Wait()
	if err != nil {
		// Like lockd run: the supervisor failed, the group is gone.
		fmt.Fprintln(os.Stderr, err)
		return 71
	}
	return r.Status()
}

// started is a supervised shell script whose stdout the test reads.
type started struct {
	p     *supervise.Process
	lines *bufio.Scanner
	start time.Time
}

// start supervises `sh -c script`.
func start(t *testing.T, script string, cfg supervise.Config) *started {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	cfg.Command = []string{"sh", "-c", script}
	cfg.Stdout = w
	cfg.Stderr = os.Stderr
	if cfg.Deadline.IsZero() {
		cfg.Deadline = time.Now().Add(time.Hour)
	}
	now := time.Now()
	p, err := supervise.Start(cfg)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Never leave a group behind, whatever the test did.
		if p.Pid() > 0 {
			_ = unix.Kill(-p.Pid(), syscall.SIGKILL)
		}
		p.Abandon()
		<-p.Done()
	})
	return &started{p: p, lines: bufio.NewScanner(r), start: now}
}

// pid reads the next line of the script's output as a pid.
func (s *started) pid(t *testing.T) int {
	t.Helper()
	if !s.lines.Scan() {
		t.Fatalf("script ended without printing a pid: %v", s.lines.Err())
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s.lines.Text()))
	if err != nil {
		t.Fatalf("script printed %q, want a pid", s.lines.Text())
	}
	return pid
}

func (s *started) wait(t *testing.T, timeout time.Duration) supervise.Result {
	t.Helper()
	select {
	case <-s.p.Done():
	case <-time.After(timeout):
		t.Fatalf("supervisor still running after %v", timeout)
	}
	r, err := s.p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s after %v", r, time.Since(s.start))
	return r
}

func alive(pid int) bool { return unix.Kill(pid, 0) != unix.ESRCH }

// assertGone checks that the group and the given processes are gone now.
func assertGone(t *testing.T, pgid int, pids ...int) {
	t.Helper()
	if alive(-pgid) {
		t.Errorf("process group %d still has members", pgid)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d still alive", pid)
		}
	}
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %v", what, timeout)
		}
		<-tick.C
	}
	return time.Since(start)
}

func TestExitStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		script     string
		wantCode   int
		wantSignal syscall.Signal
		wantStatus int
	}{
		{"true", 0, 0, 0},
		{"exit 3", 3, 0, 3},
		{"kill -TERM $$", 0, syscall.SIGTERM, 143},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			t.Parallel()
			s := start(t, tt.script, supervise.Config{KillGrace: time.Second})
			r := s.wait(t, 10*time.Second)
			if r.ExitCode != tt.wantCode || r.Signal != tt.wantSignal || r.Killed != supervise.ReasonNone {
				t.Errorf("got %+v, want exit code %d, signal %d, not killed", r, tt.wantCode, tt.wantSignal)
			}
			if got := r.Status(); got != tt.wantStatus {
				t.Errorf("got status %d, want %d", got, tt.wantStatus)
			}
			assertGone(t, r.Pid)
		})
	}
}

func TestExecFailure(t *testing.T) {
	t.Parallel()
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		command []string
		want    int
	}{
		{[]string{"lockd-no-such-command-x"}, 127},
		{[]string{"/nonexistent/dir/cmd"}, 127},
		{[]string{notExec}, 126},
	}
	for _, tt := range tests {
		t.Run(tt.command[0], func(t *testing.T) {
			p, err := supervise.Start(supervise.Config{
				Command:  tt.command,
				Deadline: time.Now().Add(time.Hour),
			})
			if err != nil {
				t.Fatal(err)
			}
			r, err := p.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if r.Status() != tt.want || r.ExecError == "" || p.Pid() != 0 {
				t.Errorf("got %+v, pid %d, want status %d with an exec error", r, p.Pid(), tt.want)
			}
			t.Logf("%s", r)
		})
	}
}

// The lease deadline ends the whole group, grandchildren included: SIGTERM
// at deadline − kill-grace, SIGKILL before the deadline for a group that
// ignores SIGTERM. The grace is wide so that a supervisor starved of CPU
// on a busy machine still wakes inside it (one woke 266 ms late, past a
// 300 ms grace, and rightly sent SIGKILL at once).
func TestDeadlineKillsGroup(t *testing.T) {
	t.Parallel()
	const grace = 1500 * time.Millisecond
	tests := []struct {
		name       string
		script     string
		wantSignal syscall.Signal
	}{
		{"term", "sleep 1000 & echo $!; sleep 1000", syscall.SIGTERM},
		{"term ignored", `trap "" TERM; sleep 1000 & echo $!; sleep 1000`, syscall.SIGKILL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			deadline := time.Now().Add(grace + time.Second)
			s := start(t, tt.script, supervise.Config{Deadline: deadline, KillGrace: grace})
			grandchild := s.pid(t)
			monoDeadline := supervise.MonoOf(deadline)
			r := s.wait(t, 10*time.Second)
			if r.Killed != supervise.ReasonDeadline || r.Signal != tt.wantSignal {
				t.Errorf("got %+v, want killed by %v for %q", r, tt.wantSignal, supervise.ReasonDeadline)
			}
			assertGone(t, r.Pid, grandchild)
			if r.TermAt == 0 || r.TermAt < monoDeadline-int64(grace) {
				t.Errorf("SIGTERM at %v before the deadline, want no earlier than %v", time.Duration(monoDeadline-r.TermAt), grace)
			}
			if tt.wantSignal == syscall.SIGKILL && (r.KillAt == 0 || r.KillAt > monoDeadline) {
				t.Errorf("SIGKILL at %v after the deadline, want before it", time.Duration(r.KillAt-monoDeadline))
			}
			t.Logf("SIGTERM %v before the deadline", time.Duration(monoDeadline-r.TermAt))
			if r.KillAt != 0 {
				t.Logf("SIGKILL %v before the deadline", time.Duration(monoDeadline-r.KillAt))
			}
		})
	}
}

// A descendant that left the group (new session) and was orphaned to the
// supervisor is killed and reaped too.
func TestEscapedDescendant(t *testing.T) {
	t.Parallel()
	s := start(t, `(setsid sh -c 'echo $$; exec sleep 1000' &); sleep 1000`, supervise.Config{KillGrace: time.Second})
	escaped := s.pid(t)
	if pgid, _ := unix.Getpgid(escaped); pgid == s.p.Pid() {
		t.Fatalf("process %d did not leave group %d", escaped, pgid)
	}
	if err := s.p.Stop("lease lost"); err != nil {
		t.Fatal(err)
	}
	r := s.wait(t, 10*time.Second)
	if r.Killed != "lease lost" || r.Signal != syscall.SIGKILL {
		t.Errorf("got %+v, want SIGKILL for %q", r, "lease lost")
	}
	assertGone(t, r.Pid, escaped)
}

// Renewals keep the command running past its first deadline.
func TestRenewedDeadline(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	s := start(t, "sleep 1.5; exit 4", supervise.Config{Deadline: time.Now().Add(lease), KillGrace: 200 * time.Millisecond})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
renew:
	for {
		select {
		case <-s.p.Done():
			break renew
		case <-tick.C:
			if err := s.p.SetDeadline(time.Now().Add(lease)); err != nil {
				break renew
			}
		}
	}
	r := s.wait(t, time.Second)
	if r.Killed != supervise.ReasonNone || r.Status() != 4 {
		t.Errorf("got %+v, want exit status 4, not killed", r)
	}
}

func TestMaxHold(t *testing.T) {
	t.Parallel()
	s := start(t, "sleep 1000 & echo $!; wait", supervise.Config{MaxHold: 200 * time.Millisecond, KillGrace: 200 * time.Millisecond})
	grandchild := s.pid(t)
	r := s.wait(t, 10*time.Second)
	if r.Killed != supervise.ReasonMaxHold || r.Signal != syscall.SIGTERM {
		t.Errorf("got %+v, want SIGTERM for %q", r, supervise.ReasonMaxHold)
	}
	assertGone(t, r.Pid, grandchild)
}

// A forwarded signal is the command's own business: its status is reported,
// not a kill. What it leaves behind in its group is ended after it exits.
func TestForwardSignal(t *testing.T) {
	t.Parallel()
	s := start(t, `trap 'exit 7' INT; sleep 1000 & echo $!; wait`, supervise.Config{KillGrace: 200 * time.Millisecond})
	leftover := s.pid(t)
	if err := s.p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := s.wait(t, 10*time.Second)
	if r.Killed != supervise.ReasonNone || r.Status() != 7 {
		t.Errorf("got %+v, want exit status 7, not killed", r)
	}
	assertGone(t, r.Pid, leftover)
}

// Closing the control pipe is what lockd run's death looks like.
func TestAbandon(t *testing.T) {
	t.Parallel()
	s := start(t, `trap "" TERM; sleep 1000 & echo $!; sleep 1000`, supervise.Config{KillGrace: 200 * time.Millisecond})
	grandchild := s.pid(t)
	s.p.Abandon()
	r := s.wait(t, 10*time.Second)
	if r.Killed != supervise.ReasonParentGone || r.Signal != syscall.SIGKILL {
		t.Errorf("got %+v, want SIGKILL for %q", r, supervise.ReasonParentGone)
	}
	if d := time.Duration(r.KillAt - r.TermAt); d < 200*time.Millisecond {
		t.Errorf("SIGKILL %v after SIGTERM, want the kill-grace 200ms", d)
	}
	assertGone(t, r.Pid, grandchild)
}

// kill -9 of the process driving the supervisor ends the group within the
// kill-grace.
func TestParentKilled(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, testParent, "sh", "-c", `trap "" TERM; sleep 1000 & sleep 1000`)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var pgid int
	if _, err := fmt.Fscanf(stderr, "pid %d\n", &pgid); err != nil {
		t.Fatalf("read pid from parent: %v", err)
	}
	t.Cleanup(func() { _ = unix.Kill(-pgid, syscall.SIGKILL) })
	go io.Copy(io.Discard, stderr)
	if !alive(-pgid) {
		t.Fatalf("group %d not running", pgid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d := eventually(t, 5*time.Second, "group gone after the parent's kill -9", func() bool { return !alive(-pgid) })
	t.Logf("group %d gone %v after kill -9 of its supervisor's parent (kill-grace 300ms)", pgid, d)
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) {
		t.Errorf("parent: got %v, want killed", err)
	}
}

// childrenOf returns the pids of pid's direct children.
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

// kill -9 of the supervisor alone: its parent, the subreaper of the
// command's processes, kills and reaps them (a zombie keeps its group
// alive) and its Wait returns an error within moments, not never.
func TestSupervisorKilled(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, testParent, "sh", "-c", `trap "" TERM; sleep 1000 & sleep 1000`)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	var pgid int
	if _, err := fmt.Fscanf(stderr, "pid %d\n", &pgid); err != nil {
		t.Fatalf("read pid from parent: %v", err)
	}
	t.Cleanup(func() { _ = unix.Kill(-pgid, syscall.SIGKILL) })
	var said strings.Builder
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&said, stderr); close(copied) }()
	go func() { <-copied; exited <- cmd.Wait() }()
	kids := childrenOf(cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("parent's children %v, want only the supervisor", kids)
	}
	killed := time.Now()
	if err := unix.Kill(kids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 71 {
			t.Errorf("parent: got %v (%s), want exit status 71", err, said.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("parent still waiting %v after kill -9 of its supervisor; its children: %v", time.Since(killed), childrenOf(cmd.Process.Pid))
	}
	t.Logf("parent exited %v after kill -9 of the supervisor: %s", time.Since(killed), strings.TrimSpace(said.String()))
	assertGone(t, pgid)
}
