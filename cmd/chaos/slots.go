package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// slot is one client position: a Go worker process or a `lockd run` loop.
// Its current process can be paused or killed by a nemesis; the slot then
// starts the next one, until the run ends.
type slot struct {
	name string
	kind string // "go", "run" or "pair" (a lock-order inversion pair)
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// groups returns the process groups of the slot's current process and of
// all its descendants (the `lockd run` supervisor leads its own group).
func (s *slot) groups() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	pids := descendants(s.cmd.Process.Pid)
	seen := map[int]bool{}
	var out []int
	for _, pid := range pids {
		pg, err := syscall.Getpgid(pid)
		if err == nil && !seen[pg] {
			seen[pg] = true
			out = append(out, pg)
		}
	}
	return out
}

// signal sends sig to every group of the slot (children first for STOP, so
// none notices its parent stopped before it stops itself).
func (s *slot) signal(sig syscall.Signal) int {
	gs := s.groups()
	for i := len(gs) - 1; i >= 0; i-- {
		_ = syscall.Kill(-gs[i], sig)
	}
	return len(gs)
}

// descendants lists pid and its descendants, from /proc.
func descendants(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out) && i < 64; i++ {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", out[i]))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// slotRunner starts and restarts the slots' processes.
type slotRunner struct {
	self      string // the chaos binary, re-executed as worker and writer
	lockd     string
	register  string
	endpoints []string
	locks     []string
	ttl       time.Duration
	until     time.Time
	seed      uint64
	broken    string
	logDir    string
	backend   string   // backendLockd or a Redis backend (endpoints are then Redis host:port)
	redisURLs []string // a Redis backend: the servers, for lockd run --backend
	setLocks  []string // names the Go workers' sets are drawn from (lockd only)
}

// pairLocks are the two names only the pair slot's sessions use.
func pairLocks(slot string) []string {
	return []string{"chaos/" + slot + "-x", "chaos/" + slot + "-y"}
}

// exec starts cmd in its own process group, killed if the tool dies.
func (r *slotRunner) exec(ctx context.Context, s *slot, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(filepath.Join(r.logDir, s.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Bounded: a process left stopped by a failed heal, or hung, is
	// killed a while after the run's end.
	limit := time.NewTimer(time.Until(r.until) + 45*time.Second)
	defer limit.Stop()
	select {
	case err = <-done:
	case <-limit.C:
		s.signal(syscall.SIGCONT)
		s.signal(syscall.SIGKILL)
		err = <-done
	}
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
	return err
}

// loop runs the slot's processes one after another until the end.
func (r *slotRunner) loop(ctx context.Context, s *slot, index int) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(index)+1000))
	eps := strings.Join(r.endpoints, ",")
	for i := 0; time.Now().Before(r.until) && ctx.Err() == nil && i < 100_000; i++ {
		switch s.kind {
		case "go":
			_ = r.exec(ctx, s, r.self, "worker", "--register", r.register, "--slot", s.name,
				"--endpoints", eps, "--locks", strings.Join(r.locks, ","), "--ttl", r.ttl.String(),
				"--until", strconv.FormatInt(r.until.UnixNano(), 10), "--seed", strconv.FormatUint(rng.Uint64(), 10),
				"--broken", r.broken, "--backend", r.backend, "--set-locks", strings.Join(r.setLocks, ","))
		case "pair":
			_ = r.exec(ctx, s, r.self, "worker", "--pair", "--register", r.register, "--slot", s.name,
				"--endpoints", eps, "--locks", strings.Join(pairLocks(s.name), ","), "--ttl", r.ttl.String(),
				"--until", strconv.FormatInt(r.until.UnixNano(), 10), "--seed", strconv.FormatUint(rng.Uint64(), 10))
		case "run":
			// Start the endpoints list at a different node each time.
			off := rng.IntN(len(r.endpoints))
			rot := append(clone(r.endpoints[off:]), r.endpoints[:off]...)
			lock := r.locks[rng.IntN(len(r.locks))]
			target := []string{"--endpoints", strings.Join(rot, ",")}
			if r.backend != backendLockd {
				target = []string{"--backend", strings.Join(r.redisURLs, ",")}
			}
			args := append([]string{"run"}, target...)
			args = append(args, "--ttl", r.ttl.String(),
				"--wait", "10s", lock, "--", r.self, "write", "--register", r.register, "--slot", s.name,
				"--client", fmt.Sprintf("%s:%d", s.name, i), "--lock", lock, "--writes", strconv.Itoa(2+rng.IntN(4)))
			_ = r.exec(ctx, s, r.lockd, args...)
		}
		pause(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
	}
}

func clone(s []string) []string { return append([]string(nil), s...) }
