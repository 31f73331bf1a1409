package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/lockdtest"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		args     []string
		wantPos  []string
		wantJSON bool
	}{
		{nil, nil, false},
		{[]string{"NAME"}, []string{"NAME"}, false},
		{[]string{"NAME", "--json"}, []string{"NAME"}, true},
		{[]string{"--json", "NAME"}, []string{"NAME"}, true},
		{[]string{"A", "--json", "B"}, []string{"A", "B"}, true},
		{[]string{"--", "--json"}, []string{"--json"}, false},
		{[]string{"A", "--", "--json", "B"}, []string{"A", "--json", "B"}, false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := newFlagSet("test", io.Discard)
			asJSON := fs.Bool("json", false, "")
			pos, err := parseArgs(fs, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pos, tt.wantPos) || *asJSON != tt.wantJSON {
				t.Errorf("got %q, json %v; want %q, json %v", pos, *asJSON, tt.wantPos, tt.wantJSON)
			}
		})
	}
	fs := newFlagSet("test", io.Discard)
	var ue usageError
	if _, err := parseArgs(fs, []string{"--nope"}); !errors.As(err, &ue) {
		t.Errorf("unknown flag: got %v, want a usageError", err)
	}
}

func TestRunParse(t *testing.T) {
	tests := []struct {
		args    []string
		check   func(f *runFlags) error
		wantErr string
	}{
		{args: []string{"job", "--", "sh", "-c", "x"}, check: func(f *runFlags) error {
			if f.name != "job" || !slices.Equal(f.command, []string{"sh", "-c", "x"}) || f.waitSet || f.ttl != 10*time.Second || f.killGrace != 2*time.Second || f.conflictExitCode != 75 {
				return fmt.Errorf("got %+v", f)
			}
			return nil
		}},
		{args: []string{"--ttl", "2s", "job", "--wait", "5s", "--", "true"}, check: func(f *runFlags) error {
			if f.ttl != 2*time.Second || f.killGrace != 500*time.Millisecond || !f.waitSet || f.wait != 5*time.Second {
				return fmt.Errorf("got %+v", f)
			}
			return nil
		}},
		{args: []string{"--no-wait", "job", "--", "true"}, check: func(f *runFlags) error {
			if !f.waitSet || f.wait != 0 {
				return fmt.Errorf("got %+v", f)
			}
			return nil
		}},
		{args: []string{"--limit", "3", "--max-hold", "1m", "--kill-grace", "1s", "job", "true", "-x"}, check: func(f *runFlags) error {
			if !f.limitSet || f.limit != 3 || f.maxHold != time.Minute || f.killGrace != time.Second || !slices.Equal(f.command, []string{"true", "-x"}) {
				return fmt.Errorf("got %+v", f)
			}
			return nil
		}},
		{args: []string{"job"}, wantErr: "usage"},
		{args: []string{"--", "true"}, wantErr: "usage"},
		{args: []string{"a", "b", "--", "true"}, wantErr: "usage"},
		{args: []string{"--no-wait", "--wait", "1s", "job", "--", "true"}, wantErr: "--no-wait and --wait"},
		{args: []string{"--shared", "--limit", "2", "job", "--", "true"}, wantErr: "--shared and --limit"},
		{args: []string{"--limit", "0", "job", "--", "true"}, wantErr: "permits"},
		{args: []string{"--wait", "-1s", "job", "--", "true"}, wantErr: "duration"},
		{args: []string{"--ttl", "2s", "--kill-grace", "1.5s", "job", "--", "true"}, wantErr: "half the TTL"},
		{args: []string{"--conflict-exit-code", "300", "job", "--", "true"}, wantErr: "0 to 255"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c := &RunCommand{Stderr: io.Discard, Getenv: streamEnvOnly}
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
			if err := tt.check(f); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestEndpointsFromEnv(t *testing.T) {
	fs := newFlagSet("test", io.Discard)
	var cf clientFlags
	cf.register(fs, func(k string) string {
		if k == endpointsEnv {
			return "a:1,b:2"
		}
		return ""
	})
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if got, want := cf.endpoints, "a:1,b:2"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestWithEnv(t *testing.T) {
	got := withEnv([]string{"A=1", "LOCKD_TOKEN=old", "B=2"}, map[string]string{envLock: "x", envToken: "7", envSession: "s"})
	want := []string{"A=1", "B=2", "LOCKD_LOCK=x", "LOCKD_TOKEN=7", "LOCKD_SESSION=s"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestExitStatus(t *testing.T) {
	tests := []struct {
		err      error
		want     int
		wantText string
	}{
		{nil, 0, ""},
		{flag.ErrHelp, 0, ""},
		{usageError{errors.New("bad flag")}, 64, "lockd: bad flag\n"},
		{exitWith(3, nil), 3, ""},
		{exitWith(75, errors.New("lock \"x\" is busy\nreally")), 75, "lockd: lock \"x\" is busy; really\n"},
		{usageError{errors.Join(errors.New("min-ttl 2h is above max-ttl 1h"), errors.New("default-ttl  10s\tis outside"))}, 64, "lockd: min-ttl 2h is above max-ttl 1h; default-ttl 10s is outside\n"},
		{errors.New("boom"), 1, "lockd: boom\n"},
		// The client library's errors carry "lockd: " too: printed once.
		{exitWith(69, fmt.Errorf("list locks: %w", errors.Join(context.DeadlineExceeded, fmt.Errorf("lockd: unavailable: %w", errors.New("dial tcp: refused"))))), 69,
			"lockd: list locks: context deadline exceeded; unavailable: dial tcp: refused\n"},
		{fmt.Errorf("lockd: %w", errors.New(`lock "lockd: x" busy`)), 1, "lockd: lock \"lockd: x\" busy\n"},
	}
	for _, tt := range tests {
		var stderr bytes.Buffer
		m := &Main{Stdout: io.Discard, Stderr: &stderr}
		if got := m.exitStatus(tt.err); got != tt.want || stderr.String() != tt.wantText {
			t.Errorf("exitStatus(%v) = %d, %q; want %d, %q", tt.err, got, stderr.String(), tt.want, tt.wantText)
		}
	}
}

func TestMainUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: streamEnvOnly}
	var ue usageError
	if err := m.Run(context.Background(), nil); !errors.As(err, &ue) {
		t.Errorf("no command: got %v, want a usage error", err)
	}
	if err := m.Run(context.Background(), []string{"frobnicate"}); !errors.As(err, &ue) {
		t.Errorf("unknown command: got %v, want a usage error", err)
	}
	// A typo is answered first and in one line, with the closest command,
	// not under the whole usage text.
	stderr.Reset()
	err := m.Run(context.Background(), []string{"lss"})
	if got := m.exitStatus(err); got != exitUsage {
		t.Errorf("lss: exit %d, want %d", got, exitUsage)
	}
	if want := "lockd: unknown command \"lss\" (did you mean \"ls\"?); \"lockd help\" lists the commands\n"; stderr.String() != want {
		t.Errorf("lss: stderr %q, want %q", stderr.String(), want)
	}
	if err := m.Run(context.Background(), []string{"version"}); err != nil || !strings.HasPrefix(stdout.String(), "lockd ") {
		t.Errorf("version: got %v, output %q", err, stdout.String())
	}
}

// lockd (the command) against a real in-process server: stdout and stderr.
func runMain(t *testing.T, url string, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	m := &Main{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
		if k == endpointsEnv {
			return url
		}
		return ""
	}}
	err := m.Run(context.Background(), args)
	return stdout.String(), stderr.String(), err
}

// ls says so when there are no locks, instead of printing nothing; --json
// prints the empty list and nothing else.
func TestLsNoLocks(t *testing.T) {
	srv := lockdtest.New(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"ls"}, "no locks\n"},
		{[]string{"ls", "jobs/"}, "no locks with prefix \"jobs/\"\n"},
		{[]string{"ls", "--json"}, "{\n  \"locks\": [],\n  \"nextPageToken\": \"\"\n}\n"},
	} {
		stdout, stderr, err := runMain(t, srv.URL(), tt.args...)
		if err != nil || stdout != tt.want || stderr != "" {
			t.Errorf("lockd %s: got %v, stdout %q, stderr %q; want stdout %q", strings.Join(tt.args, " "), err, stdout, stderr, tt.want)
		}
	}
}

// status spells VOTER yes/no, as members does.
func TestStatusVoter(t *testing.T) {
	srv := lockdtest.New(t)
	stdout, _, err := runMain(t, srv.URL(), "status")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s+\S+\s+leader\s+yes\s+http://`).MatchString(stdout) || strings.Contains(stdout, "true") {
		t.Errorf("status: got\n%s\nwant the member's VOTER column to say yes", stdout)
	}
}

// lockd run -h shows a synopsis, the flags and the exit statuses, and exits 0.
func TestRunHelp(t *testing.T) {
	var stderr bytes.Buffer
	m := &Main{Stdout: io.Discard, Stderr: &stderr, Getenv: streamEnvOnly}
	err := m.Run(context.Background(), []string{"run", "-h"})
	if code := m.exitStatus(err); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	help := stderr.String()
	for _, want := range []string{
		"lockd run [flags] NAME -- CMD [ARGS...]", "-conflict-exit-code", "Exit status:",
		"75 ", "69 ", "71 ", "64 ", "126, 127", "130, 143", "SIGINT (Ctrl-C)", "LOCKD_TOKEN",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("lockd run -h: missing %q in\n%s", want, help)
		}
	}

	// A bad flag is reported once, by Main, without the whole help.
	stderr.Reset()
	err = m.Run(context.Background(), []string{"run", "--bogus", "x", "--", "true"})
	if code := m.exitStatus(err); code != exitUsage || stderr.String() != "lockd: flag provided but not defined: -bogus\n" {
		t.Errorf("bad flag: exit status %d, stderr %q", code, stderr.String())
	}
}

// streamEnvOnly is an empty environment but for $LOCKD_STREAM, which the
// tests pass on so that CI's LOCKD_STREAM=off pass runs the in-process
// commands over unary calls too (the client library reads no environment).
func streamEnvOnly(k string) string {
	if k == streamEnv {
		return os.Getenv(streamEnv)
	}
	return ""
}

func TestStreamEnv(t *testing.T) {
	for v, want := range map[string]bool{"": true, "on": true, "off": false, "0": false, "false": false, " off ": false} {
		fs := newFlagSet("test", io.Discard)
		var cf clientFlags
		cf.register(fs, func(k string) string {
			if k == streamEnv {
				return v
			}
			return ""
		})
		if cf.stream != want {
			t.Errorf("%s=%q: stream %v, want %v", streamEnv, v, cf.stream, want)
		}
	}
}
