package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
)

func TestMembersParse(t *testing.T) {
	env := func(k string) string {
		if k == endpointsEnv {
			return "a:1,b:2"
		}
		return ""
	}
	tests := []struct {
		args    []string
		json    bool
		remove  string
		eps     string
		timeout time.Duration
		wantErr string
	}{
		{args: nil, eps: "a:1,b:2", timeout: 10 * time.Second},
		{args: []string{"--json"}, json: true, eps: "a:1,b:2", timeout: 10 * time.Second},
		{args: []string{"--endpoints", "x:9", "--timeout", "2s"}, eps: "x:9", timeout: 2 * time.Second},
		{args: []string{"remove", "n3"}, remove: "n3", eps: "a:1,b:2", timeout: 10 * time.Second},
		{args: []string{"remove", "--endpoints", "x:9", "n3"}, remove: "n3", eps: "x:9", timeout: 10 * time.Second},
		{args: []string{"remove", "n3", "--timeout", "3s"}, remove: "n3", eps: "a:1,b:2", timeout: 3 * time.Second},
		{args: []string{"remove"}, wantErr: "usage: lockd members remove ID"},
		{args: []string{"remove", "a", "b"}, wantErr: "usage: lockd members remove ID"},
		{args: []string{"remove", " "}, wantErr: "must not be empty"},
		{args: []string{"remove", "n3", "--json"}, wantErr: "--json"},
		{args: []string{"delete", "n3"}, wantErr: `unknown argument "delete"`},
		{args: []string{"--bogus"}, wantErr: "bogus"},
		{args: []string{"--timeout", "soon"}, wantErr: "timeout"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c := &MembersCommand{env: commandEnv{stdout: io.Discard, stderr: io.Discard, getenv: env}}
			f, err := c.parse(tt.args)
			if tt.wantErr != "" {
				var ue usageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.json != tt.json || f.remove != tt.remove || f.client.endpoints != tt.eps || f.client.timeout != tt.timeout {
				t.Errorf("got json %v remove %q endpoints %q timeout %v; want %v %q %q %v",
					f.json, f.remove, f.client.endpoints, f.client.timeout, tt.json, tt.remove, tt.eps, tt.timeout)
			}
		})
	}
}

func TestLeaderParse(t *testing.T) {
	tests := []struct {
		args    []string
		to      string
		eps     string
		wantErr string
	}{
		{args: []string{"transfer"}, eps: "http://127.0.0.1:7070"},
		{args: []string{"transfer", "n2"}, to: "n2", eps: "http://127.0.0.1:7070"},
		{args: []string{"--endpoints", "h:1", "transfer", "n2"}, to: "n2", eps: "h:1"},
		{args: []string{"transfer", "n2", "--endpoints", "h:1"}, to: "n2", eps: "h:1"},
		{args: nil, wantErr: "usage: lockd leader transfer [ID]"},
		{args: []string{"n2"}, wantErr: `unknown argument "n2"`},
		{args: []string{"transfer", "n2", "n3"}, wantErr: "usage: lockd leader transfer [ID]"},
		{args: []string{"transfer", ""}, wantErr: "must not be empty"},
		{args: []string{"transfer", "--json"}, wantErr: "json"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c := &LeaderCommand{env: commandEnv{stdout: io.Discard, stderr: io.Discard, getenv: streamEnvOnly}}
			f, err := c.parse(tt.args)
			if tt.wantErr != "" {
				var ue usageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.to != tt.to || f.client.endpoints != tt.eps {
				t.Errorf("got to %q endpoints %q, want %q %q", f.to, f.client.endpoints, tt.to, tt.eps)
			}
		})
	}
}

// The admin commands map the client's errors (which went through its
// retry loop, leader following and error mapping) to the documented exit
// statuses, in one line starting with the operation.
func TestAdminCallErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		exit int
	}{
		{"unavailable", fmt.Errorf("%w: no leader", lockd.ErrUnavailable), exitUnavailable},
		{"ran out", fmt.Errorf("x: %w", context.DeadlineExceeded), exitUnavailable},
		{"invalid", fmt.Errorf("%w: node id", lockd.ErrInvalidArgument), exitUsage},
		{"other cluster", fmt.Errorf("%w: b", lockd.ErrClusterMismatch), exitFailure},
		{"transfer failed", errors.New("leadership transfer: timed out"), exitFailure},
		{"interrupted", context.Canceled, exitFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ee *exitError
			err := callError("op", tt.err)
			if !errors.As(err, &ee) || ee.code != tt.exit {
				t.Errorf("callError: %v, want exit status %d", err, tt.exit)
			}
			if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "op") {
				t.Errorf("callError: %q, want one line starting with the operation", err)
			}
		})
	}
}

// An unreachable cluster: exit 69 within --timeout, one line.
func TestClusterCommandsUnreachable(t *testing.T) {
	for _, args := range [][]string{
		{"members", "--timeout", "300ms", "--endpoints", "127.0.0.1:1"},
		{"members", "remove", "n2", "--timeout", "300ms", "--endpoints", "127.0.0.1:1"},
		{"leader", "transfer", "--timeout", "300ms", "--endpoints", "127.0.0.1:1,127.0.0.1:2"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var stderr strings.Builder
			m := &Main{Stdout: io.Discard, Stderr: &stderr, Getenv: streamEnvOnly}
			start := time.Now()
			code := m.exitStatus(m.Run(context.Background(), args))
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v with --timeout 300ms", took)
			}
			if code != exitUnavailable || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("exit status %d, stderr %q; want %d and one line", code, stderr.String(), exitUnavailable)
			}
		})
	}
}
