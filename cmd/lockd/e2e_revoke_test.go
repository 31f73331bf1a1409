package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestRunOnRevokeTerm: `lockd run --on-revoke=term` holds a lock while a
// second `lockd run` waits for it and `lockd watch` follows it. A
// RequestRelease reaches the holder's session: it logs the reason and
// sends SIGTERM to its command, which ends (status 143, its own); the
// lock goes to the waiter, which runs and ends; the watch shows the
// request.
func TestRunOnRevokeTerm(t *testing.T) {
	srv := startServer(t)
	watch := startLockd(t, srv.url, "watch", "revoke/job")
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool { return scrapeMetric(t, srv.url, "lockd_watch_streams_open") >= 1 }) {
		t.Fatalf("the watch did not connect; it printed %q", watch.lines())
	}
	holder := startRun(t, srv, "--on-revoke=term", "revoke/job", "--", "sleep", "60")
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		return strings.Contains(strings.Join(watch.lines(), "\n"), "GRANTED\trevoke/job")
	}) {
		t.Fatalf("the watch saw no grant; watch printed %q, holder %q", watch.lines(), holder.output())
	}
	waiter := startRun(t, srv, "revoke/job", "--", "true")
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		return strings.Contains(strings.Join(watch.lines(), "\n"), "QUEUED\trevoke/job")
	}) {
		t.Fatalf("the waiter did not queue; watch printed %q, waiter %q", watch.lines(), waiter.output())
	}

	c, err := lockd.New(lockd.WithEndpoints(srv.url))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	resp, err := c.Service().RequestRelease(t.Context(), connect.NewRequest(&lockdv1.RequestReleaseRequest{Name: "revoke/job", Reason: "maintenance window"}))
	if err != nil || resp.Msg.GetHolders() != 1 {
		t.Fatalf("RequestRelease: %v (%d holds asked)", err, resp.Msg.GetHolders())
	}

	if code := holder.wait(t, 30*time.Second); code != 143 {
		t.Fatalf("holder: exit %d, want 143 (sleep ended by SIGTERM); output: %s", code, holder.output())
	}
	if out := holder.output(); !strings.Contains(out, `release of lock "revoke/job"`) || !strings.Contains(out, "maintenance window") || !strings.Contains(out, "sending SIGTERM") {
		t.Errorf("holder printed %q, want the request, its reason and the SIGTERM", out)
	}
	if code := waiter.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("waiter: exit %d; output: %s", code, waiter.output())
	}
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		out := strings.Join(watch.lines(), "\n")
		return strings.Contains(out, "RELEASE_REQUESTED\trevoke/job") && strings.Contains(out, `value="maintenance window"`)
	}) {
		t.Fatalf("the watch showed no RELEASE_REQUESTED with the reason: %q", watch.lines())
	}
}

// TestRunOnRevokeTermOncePerRun: `lockd run --on-revoke=term` with a
// --lock set logs a request for each lock of the set, but sends SIGTERM
// once per run (its command ignores it here, and ends when told to).
func TestRunOnRevokeTermOncePerRun(t *testing.T) {
	srv := startServer(t)
	stop := filepath.Join(t.TempDir(), "stop")
	holder := startRun(t, srv, "--on-revoke=term", "--lock", "once/a", "--lock", "once/b", "--",
		"sh", "-c", `trap "" TERM; while [ ! -e "$1" ]; do sleep 0.02; done`, "sh", stop)
	c, err := lockd.New(lockd.WithEndpoints(srv.url))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
		resp, err := c.Service().DescribeLock(t.Context(), connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "once/b"}))
		return err == nil && len(resp.Msg.GetLock().GetHolders()) == 1
	}) {
		t.Fatalf("the set was not taken; holder printed %q", holder.output())
	}
	for _, name := range []string{"once/a", "once/b"} {
		resp, err := c.Service().RequestRelease(t.Context(), connect.NewRequest(&lockdv1.RequestReleaseRequest{Name: name, Reason: "shrink"}))
		if err != nil || resp.Msg.GetHolders() != 1 {
			t.Fatalf("RequestRelease %s: %v (%d holds asked)", name, err, resp.Msg.GetHolders())
		}
		if !pollEvery(20*time.Second, 20*time.Millisecond, func() bool {
			return strings.Contains(holder.output(), `release of lock "`+name+`"`)
		}) {
			t.Fatalf("the holder did not log the request for %s: %q", name, holder.output())
		}
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := holder.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("holder: exit %d, want 0; output: %s", code, holder.output())
	}
	out := holder.output()
	if n := strings.Count(out, "sending SIGTERM"); n != 1 || !strings.Contains(out, "SIGTERM already sent") {
		t.Errorf("holder sent SIGTERM %d times, want once (then \"already sent\"); output: %s", n, out)
	}
}
