package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tlsCLI runs `lockd ARGS...` in dir ("" for the test's) with env added,
// bounded in time, and returns stdout, stderr and the exit status.
func tlsCLI(t *testing.T, dir string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lockdBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("lockd %s still running after 30s", strings.Join(args, " "))
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	t.Fatalf("lockd %s: %v", strings.Join(args, " "), err)
	return "", "", -1
}

// TestServeRefusesPlaintextNonLoopback: `lockd serve` on a
// wildcard address without TLS exits 64 before it listens, saying why,
// unless --insecure; loopback with no flags is the quick start (the other
// e2e tests).
func TestServeRefusesPlaintextNonLoopback(t *testing.T) {
	needBinary(t)
	code, stderr, _ := serveOnce(t, "--data-dir", filepath.Join(t.TempDir(), "d"),
		"--listen", "0.0.0.0:0", "--advertise", "http://10.1.2.3:7070", "--raft-listen", freePort(t))
	if code != exitUsage {
		t.Fatalf("exit %d, want %d: %s", code, exitUsage, stderr)
	}
	wantOneLine(t, stderr, `listen "0.0.0.0:0" is not a loopback address`, "--insecure")
}
