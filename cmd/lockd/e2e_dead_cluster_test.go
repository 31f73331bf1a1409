package main

import (
	"strings"
	"testing"
	"time"
)

// A dead cluster gives a fast answer: lockd run against endpoints that all
// refuse connections exits 69 within max(--wait, the connect budget), not
// after the client's 30 s retry timeout. A cron job must not hang on a
// dead server.
func TestRunDeadClusterFastAnswer(t *testing.T) {
	needBinary(t)
	// freePort closes its listener: nothing listens on these ports.
	dead := freePort(t) + "," + freePort(t)
	const slack = 2 * time.Second
	tests := []struct {
		name   string
		args   []string
		budget time.Duration
	}{
		{"no-wait, default budget", []string{"--no-wait"}, defaultConnectTimeout},
		{"no-wait, short budget", []string{"--no-wait", "--connect-timeout", "1s"}, time.Second},
		{"wait 2s", []string{"--wait", "2s"}, max(2*time.Second, defaultConnectTimeout)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append(append([]string{}, tt.args...), "dead-cluster", "--", "true")
			start := time.Now()
			p := startRunAt(t, dead, args...)
			code := p.wait(t, tt.budget+15*time.Second)
			took := p.exitAt.Sub(start)
			t.Logf("lockd run %s: exit %d after %v: %s", strings.Join(tt.args, " "), code, took.Round(time.Millisecond), p.output())
			if code != exitUnavailable {
				t.Errorf("exit status %d, want %d (unavailable); output: %s", code, exitUnavailable, p.output())
			}
			if took > tt.budget+slack {
				t.Errorf("exited after %v, want within %v + %v", took, tt.budget, slack)
			}
		})
	}
}
