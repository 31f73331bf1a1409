package main

// Surprises a new user met, tried with real processes
// as the README's quick start has them.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lockdCmd runs the lockd binary with args and returns its combined output,
// exit status and how long it took.
func lockdCmd(t *testing.T, args ...string) (string, int, time.Duration) {
	t.Helper()
	cmd := exec.Command(lockdBin, args...)
	cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("lockd %v: %v", args, err)
	}
	return strings.TrimSpace(string(out)), code, took
}

// Nothing listening: every command answers within about a second (not the
// 5 s connect timeout), exit 69, and asks whether lockd serve runs there.
// A Raft port given by mistake is named as such, as fast.
func TestNewUserWrongAddress(t *testing.T) {
	needBinary(t)
	raftAddr := freePort(t)
	startServerAt(t, filepath.Join(t.TempDir(), "data"), freePort(t), raftAddr)
	down := freePort(t)
	for _, tc := range []struct {
		addr, want string
	}{
		{down, "(is `lockd serve` running at " + down + "?)"},
		{raftAddr, raftAddr + " does not speak the lockd API (is it the Raft port? the API listens on --listen, 127.0.0.1:7070 by default)"},
	} {
		for _, args := range [][]string{
			{"ls", "--endpoints", tc.addr},
			{"members", "--endpoints", tc.addr},
			{"run", "--no-wait", "--endpoints", tc.addr, "x", "--", "true"},
			{"run", "--endpoints", tc.addr, "x", "--", "true"},
		} {
			out, code, took := lockdCmd(t, args...)
			if code != exitUnavailable || !strings.Contains(out, tc.want) || strings.Count(out, "\n") > 0 {
				t.Errorf("lockd %v: exit %d, output %q; want exit %d and one line containing %q", args, code, out, exitUnavailable, tc.want)
			}
			if took > 3*time.Second {
				t.Errorf("lockd %v: took %v, want about a second", args, took)
			}
		}
	}
}

// Ctrl-C (SIGINT) while lockd run waits for the lock exits 130, SIGTERM
// 143, as the exit table and lockd run -h say; the command does not run.
func TestRunInterruptedWhileWaiting(t *testing.T) {
	s := startServer(t)
	holder := startRun(t, s, "busy", "--", "sleep", "1000")
	if !poll(10*time.Second, func() bool {
		out, _ := exec.Command(lockdBin, "ls", "--endpoints", s.url).Output()
		return strings.Contains(string(out), "busy")
	}) {
		t.Fatalf("holder did not get the lock: %s", holder.output())
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		ran := filepath.Join(t.TempDir(), "ran")
		p := startRun(t, s, "busy", "--", "touch", ran)
		// Wait until it queues (the lock shows a waiter), then interrupt.
		if !poll(10*time.Second, func() bool {
			out, _ := exec.Command(lockdBin, "describe", "busy", "--endpoints", s.url).Output()
			return strings.Contains(string(out), "waiters (1)")
		}) {
			t.Fatalf("lockd run did not queue: %s", p.output())
		}
		_ = p.cmd.Process.Signal(sig)
		if code := p.wait(t, 10*time.Second); code != 128+int(sig) {
			t.Errorf("%v while waiting: exit %d, want %d; output %s", sig, code, 128+int(sig), p.output())
		}
		if !strings.Contains(p.output(), "interrupted by "+signalName(sig)+" while waiting") {
			t.Errorf("%v while waiting: output %q", sig, p.output())
		}
		if _, err := os.Stat(ran); err == nil {
			t.Errorf("%v while waiting: the command ran", sig)
		}
	}
}

// A first deploy of lockd cron does not run the period under way: by
// default because the period began more than --catch-up (1h) ago, and
// with a window as long as the period because the fleet has no record of
// an earlier run; --catch-up-first runs it, and later servers find it done.
func TestCronFirstStart(t *testing.T) {
	s := startServer(t)
	out := filepath.Join(t.TempDir(), "out")
	env := []string{"OUT=" + out}
	// A yearly schedule: the current period began long ago and is open
	// for the whole test.
	job := []string{"0 0 1 1 *", "report", "--", "sh", "-c", `echo run >> "$OUT"`}
	for i, tc := range []struct {
		flags []string
		log   string
	}{
		{nil, "period skipped: reached after its window"},
		{[]string{"--catch-up", "0"}, "period skipped: it began before this server started and the fleet has no record of an earlier period"},
		{[]string{"--catch-up", "0", "--catch-up-first"}, "job succeeded: period done"},
		{[]string{"--catch-up", "0"}, "period already done"},
	} {
		cmd, logFile, done := startCron(t, s, env, append(append([]string(nil), tc.flags...), job...)...)
		if !poll(10*time.Second, func() bool { b, _ := os.ReadFile(logFile); return strings.Contains(string(b), tc.log) }) {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("lockd cron %v: no %q within 10s; log:\n%s", tc.flags, tc.log, b)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := <-done; err != nil {
			t.Errorf("lockd cron %v after SIGTERM: %v", tc.flags, err)
		}
		if b, _ := os.ReadFile(out); i < 2 && len(b) > 0 {
			t.Errorf("lockd cron %v: the job ran (output %q), want the period skipped", tc.flags, b)
		}
	}
	if b, _ := os.ReadFile(out); string(b) != "run\n" {
		t.Errorf("job output %q, want one run (by --catch-up-first)", b)
	}
}

// lockd members shows a killed node as unreachable (plain and --json),
// the live ones with their roles.
func TestMembersUnreachable(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitStable(t, c.nodes, 30*time.Second)
	var victim *clusterNode
	var live []int
	for i, n := range c.nodes {
		if n.id != leader && victim == nil {
			victim = n
			continue
		}
		live = append(live, i)
	}
	victim.kill(t)
	eps := c.endpoints(live...)
	stdout, stderr, code := lockdCLI(t, eps, "members")
	if code != 0 {
		t.Fatalf("lockd members: exit %d: %s", code, stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n")[1:] {
		f := strings.Fields(line)
		switch {
		case f[0] == victim.id && f[1] != "unreachable":
			t.Errorf("killed member %s: %q, want role unreachable", victim.id, line)
		case f[0] != victim.id && f[1] != "leader" && f[1] != "follower":
			t.Errorf("live member: %q, want leader or follower", line)
		}
	}
	stdout, stderr, code = lockdCLI(t, eps, "members", "--json")
	if code != 0 {
		t.Fatalf("lockd members --json: exit %d: %s", code, stderr)
	}
	var out struct {
		Members []struct{ ID, Role string }
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("lockd members --json: %v: %s", err, stdout)
	}
	if len(out.Members) != 3 {
		t.Fatalf("lockd members --json: %s, want 3 members", stdout)
	}
	for _, m := range out.Members {
		if (m.ID == victim.id) != (m.Role == "unreachable") {
			t.Errorf("lockd members --json: member %s role %q (killed: %s)", m.ID, m.Role, victim.id)
		}
	}
}
