package main

import (
	"strings"
	"testing"
	"time"
)

// TestRequestReleaseRevokesRun with real processes: `lockd policy` sets and
// prints a lock's revoke grace; `lockd request-release` (authentication
// off: an admin) asks the holder, a `lockd run` that would sleep for ten
// minutes, and says the grace started; `lockd describe` shows the request;
// once the grace ran out the holder's session is revoked and the run stops
// its command and exits 71, as on a lost lease.
func TestRequestReleaseRevokesRun(t *testing.T) {
	srv := startServer(t)
	var out, errOut string
	var code int
	// The policy field needs the cluster version a fresh node raises at
	// once; retried while it has not.
	if !pollEvery(20*time.Second, 50*time.Millisecond, func() bool {
		out, errOut, code = lockdCLI(t, srv.url, "policy", "grace/job", "--revoke-grace", "1s")
		return code == 0
	}) {
		t.Fatalf("policy: exit %d: %s %s", code, out, errOut)
	}
	if want := "policy of \"grace/job\": default max hold none, revoke grace 1s\n"; out != want {
		t.Fatalf("policy printed %q, want %q", out, want)
	}
	if out, _, code = lockdCLI(t, srv.url, "policy", "grace/job"); code != 0 || !strings.Contains(out, "revoke grace 1s") {
		t.Fatalf("policy read: exit %d: %q", code, out)
	}
	if _, errOut, code = lockdCLI(t, srv.url, "policy", "grace/job", "--revoke-grace", "10ms"); code != exitUsage || !strings.Contains(errOut, "1s to 1h") {
		t.Fatalf("a 10ms grace: exit %d: %q, want %d and the bounds", code, errOut, exitUsage)
	}
	holder := startLockd(t, srv.url, "run", "--ttl", "3s", "grace/job", "--", "sleep", "600")
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		o, _, c := lockdCLI(t, srv.url, "describe", "--json", "grace/job")
		return c == 0 && strings.Contains(o, `"holders"`)
	}) {
		t.Fatalf("grace/job not held; holder printed %q", holder.lines())
	}
	asked := time.Now()
	out, errOut, code = lockdCLI(t, srv.url, "request-release", "grace/job", "--reason", "deploy 42")
	if code != 0 || !strings.HasPrefix(out, "asked the holder of \"grace/job\" to let go\nrevoke grace 1s:") {
		t.Fatalf("request-release: exit %d: %q %q", code, out, errOut)
	}
	if out, _, code = lockdCLI(t, srv.url, "describe", "grace/job"); code != 0 || !strings.Contains(out, "asked to let go:") || !strings.Contains(out, `"deploy 42"`) {
		t.Fatalf("describe after the request: exit %d:\n%s", code, out)
	}
	select {
	case <-holder.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the holder still runs 30s after the request; it printed %q", holder.lines())
	}
	if got := holder.cmd.ProcessState.ExitCode(); got != exitStopped {
		t.Fatalf("holder exited %d, want %d; it printed %q", got, exitStopped, holder.lines())
	}
	if took := time.Since(asked); took < time.Second {
		t.Fatalf("holder stopped %v after the request, within the 1s grace", took)
	}
	if out, _, code = lockdCLI(t, srv.url, "request-release", "grace/job"); code != 0 || out != "lock \"grace/job\" has no holders: nobody asked\n" {
		t.Fatalf("request-release of a free lock: exit %d: %q", code, out)
	}
	t.Logf("holder stopped %v after the request; it printed %q", time.Since(asked), holder.lines())
}
