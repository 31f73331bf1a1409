package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
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
			c := &LeaderCommand{env: commandEnv{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}}
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

func TestEndpointURLs(t *testing.T) {
	got := endpointURLs(" 127.0.0.1:7001, http://h:2/ ,host,[::1]:9,,https://x.example/lockd")
	want := []string{"http://127.0.0.1:7001", "http://h:2", "http://host:7070", "http://[::1]:9", "https://x.example/lockd"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func clusterErr(code connect.Code, reason lockdv1.ErrorReason) error {
	e := connect.NewError(code, errors.New("x"))
	if reason != lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		d, err := connect.NewErrorDetail(&lockdv1.ErrorDetail{Reason: reason})
		if err != nil {
			panic(err)
		}
		e.AddDetail(d)
	}
	return e
}

func TestClusterErrors(t *testing.T) {
	refused := connect.NewError(connect.CodeUnavailable, fmt.Errorf("dial: %w", syscall.ECONNREFUSED))
	tests := []struct {
		name          string
		err           error
		retry, retryI bool // not idempotent, idempotent
		exit          int
	}{
		{"not leader", clusterErr(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER), true, true, exitUnavailable},
		{"no leader", clusterErr(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NO_LEADER), true, true, exitUnavailable},
		{"outcome unknown", clusterErr(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN), false, true, exitUnavailable},
		{"invalid", clusterErr(connect.CodeInvalidArgument, lockdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT), false, false, exitUsage},
		{"transfer failed", clusterErr(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED), false, false, exitFailure},
		{"connection refused", refused, true, true, exitUnavailable},
		{"transport error", connect.NewError(connect.CodeUnavailable, errors.New("EOF")), false, true, exitUnavailable},
		{"attempt timed out", fmt.Errorf("x: %w", context.DeadlineExceeded), false, true, exitUnavailable},
		{"interrupted", context.Canceled, false, false, exitFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryCluster(tt.err, false); got != tt.retry {
				t.Errorf("retryCluster(idempotent=false) = %v, want %v", got, tt.retry)
			}
			if got := retryCluster(tt.err, true); got != tt.retryI {
				t.Errorf("retryCluster(idempotent=true) = %v, want %v", got, tt.retryI)
			}
			var ee *exitError
			err := clusterError("op", tt.err)
			if !errors.As(err, &ee) || ee.code != tt.exit {
				t.Errorf("clusterError: %v, want exit status %d", err, tt.exit)
			}
			if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "op") {
				t.Errorf("clusterError: %q, want one line starting with the operation", err)
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
			m := &Main{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
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
