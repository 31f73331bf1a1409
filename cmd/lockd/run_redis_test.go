package main

// lockd run over the Redis backends:
// real redis-server processes (redislock/redistest) and real lockd run
// processes; the same supervision as on lockd.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/redislock/redistest"
)

func TestRunRedisParse(t *testing.T) {
	c := &RunCommand{Stderr: io.Discard, Getenv: streamEnvOnly}
	f, err := c.parse([]string{"--backend", "redis://a:1,redis://b:2", "--backend", "redis://c:3", "x", "--", "true"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.redis, " "); got != "redis://a:1 redis://b:2 redis://c:3" {
		t.Errorf("backends %q", got)
	}
	for _, args := range [][]string{
		{"--backend", "http://a:1", "x", "--", "true"},
		{"--backend", "redis://a:1", "--once", "1m", "x", "--", "true"},
		{"--backend", "redis://a:1", "--shared", "x", "--", "true"},
		{"--backend", "redis://a:1", "--lock-delay", "1s", "x", "--", "true"},
		{"--backend", "redis://a:1,redis://b:2", "x", "--", "true"},
		{"--backend", "redis://a:1,redis://b:2,redis://c:3", "--limit", "2", "x", "--", "true"},
	} {
		var ue usageError
		if _, err := c.parse(args); !errors.As(err, &ue) {
			t.Errorf("parse %q: got %v, want a usage error", args, err)
		}
	}
	// lockd elect has no Redis form: its value and observers live in lockd.
	e := &RunCommand{Stderr: io.Discard, Getenv: streamEnvOnly, elect: true}
	var ue usageError
	if _, err := e.parse([]string{"--backend", "redis://a:1", "x", "v", "--", "true"}); !errors.As(err, &ue) {
		t.Errorf("elect --backend: got %v, want a usage error", err)
	}
	var stderr bytes.Buffer
	m := &Main{Stdout: io.Discard, Stderr: &stderr, Getenv: streamEnvOnly}
	_ = m.Run(context.Background(), []string{"run", "-h"})
	for _, want := range []string{"-backend", "Backends (--backend):", "NO fencing token", "asynchronous replica"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("lockd run -h: missing %q", want)
		}
	}
}

// startRunRedis starts `lockd run --backend URLS args...`.
func startRunRedis(t *testing.T, urls string, args ...string) *runProc {
	t.Helper()
	needBinary(t)
	return startRunAt(t, "http://127.0.0.1:1", append([]string{"--backend", urls}, args...)...)
}

// Mutual exclusion with increasing tokens over a single Redis, and a
// command that outlives several TTLs is kept alive by the renewals (the
// supervisor's deadline follows them).
func TestRunRedisMutualExclusion(t *testing.T) {
	r := redistest.New(t)
	url := "redis://" + r.Addr()
	logFile := filepath.Join(t.TempDir(), "log")
	t.Setenv("LOG", logFile)
	script := `echo "start $LOCKD_TOKEN $LOCKD_LOCK" >> "$LOG"; sleep 0.05; echo "end $LOCKD_TOKEN $LOCKD_LOCK" >> "$LOG"`
	const n = 8
	procs := make([]*runProc, n)
	for i := range procs {
		procs[i] = startRunRedis(t, url, "--ttl", "2s", "redis-1", "--", "sh", "-c", script)
	}
	for i, p := range procs {
		if code := p.wait(t, 60*time.Second); code != 0 {
			t.Errorf("lockd run %d: exit status %d: %s", i, code, p.output())
		}
	}
	checkLog(t, logFile, n)

	long := startRunRedis(t, url, "--ttl", "1s", "redis-long", "--", "sleep", "3")
	if code := long.wait(t, 15*time.Second); code != 0 {
		t.Errorf("a 3 s command under a 1 s TTL: exit status %d, want 0 (renewals must move the supervisor's deadline): %s", code, long.output())
	}

	// Busy: --no-wait while held exits 75.
	out := filepath.Join(t.TempDir(), "held")
	holder := startRunRedis(t, url, "redis-busy", "--", "sh", "-c", `echo held > "`+out+`"; sleep 1000`)
	readFields(t, out, 1, 10*time.Second)
	busy := startRunRedis(t, url, "--no-wait", "redis-busy", "--", "true")
	if code := busy.wait(t, 10*time.Second); code != exitConflict {
		t.Errorf("--no-wait on a held lock: exit status %d, want %d: %s", code, exitConflict, busy.output())
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	if code := holder.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("holder after SIGTERM: exit status %d: %s", code, holder.output())
	}
}

// Freezing Redis under a holder: the renewals stop, and the command's
// group is dead by the client deadline (TTL·0.99 − margin), lockd run
// exits 71 — the same bound as on lockd.
func TestRunRedisLeaseLoss(t *testing.T) {
	r := redistest.New(t)
	const ttl = 2 * time.Second
	bound := time.Duration(float64(ttl)*0.99) - max(100*time.Millisecond, ttl/50)
	pids := filepath.Join(t.TempDir(), "pids")
	t.Setenv("PIDS", pids)
	p := startRunRedis(t, "redis://"+r.Addr(), "--ttl", ttl.String(), "redis-loss", "--", "sh", "-c", `trap "" TERM; sleep 1000 & echo $$ $! > "$PIDS"; wait`)
	f := readFields(t, pids, 2, 10*time.Second)
	pgid, grandchild := atoi(t, f[0]), atoi(t, f[1])
	frozen := time.Now()
	r.Pause()
	defer r.Resume()
	if !poll(bound+3*time.Second, func() bool { return !alive(-pgid) && !alive(grandchild) }) {
		t.Fatalf("group %d still alive %v after freezing Redis", pgid, time.Since(frozen))
	}
	gone := time.Since(frozen)
	t.Logf("group gone %v after SIGSTOP of Redis (bound %v)", gone, bound)
	if gone > bound {
		t.Errorf("group gone %v after the freeze, want within %v", gone, bound)
	}
	if code := p.wait(t, 10*time.Second); code != exitStopped {
		t.Errorf("exit status %d, want %d: %s", code, exitStopped, p.output())
	}
}

// Redlock over three nodes, one of them down: the command runs, with no
// LOCKD_TOKEN (Redlock issues none), not even one inherited.
func TestRunRedlock(t *testing.T) {
	nodes := []*redistest.Server{redistest.New(t), redistest.New(t), redistest.New(t)}
	var urls []string
	for _, n := range nodes {
		urls = append(urls, "redis://"+n.Addr())
	}
	nodes[2].Stop()
	out := filepath.Join(t.TempDir(), "out")
	t.Setenv("LOCKD_TOKEN", "12345") // as if inside another lockd run
	p := startRunRedis(t, strings.Join(urls, ","), "redlock-1", "--", "sh", "-c", `echo "token=${LOCKD_TOKEN-unset} lock=$LOCKD_LOCK" > "`+out+`"`)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit status %d: %s", code, p.output())
	}
	if b, _ := os.ReadFile(out); strings.TrimSpace(string(b)) != "token=unset lock=redlock-1" {
		t.Errorf("command saw %q", b)
	}
	// A majority down: no quorum, exit 69 within --connect-timeout.
	nodes[1].Stop()
	p = startRunRedis(t, strings.Join(urls, ","), "--connect-timeout", "2s", "redlock-1", "--", "true")
	if code := p.wait(t, 30*time.Second); code != exitUnavailable {
		t.Errorf("majority down: exit status %d, want %d: %s", code, exitUnavailable, p.output())
	}
}
