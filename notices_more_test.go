package lockd_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// A hold asked first without a revoke grace hears again when an admin's
// request starts one (so the holder learns when it is revoked), and no
// more after that.
func TestReleaseRequestedAgainWithGrace(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	m := newSession(t, c).NewMutex("graced")
	ch := m.ReleaseRequested()
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	requestRelease(t, c, "graced", "first")
	if r := nextNotice(t, ch); r.RevokeGrace != 0 || r.Reason != "first" {
		t.Fatalf("first notice %+v, want no grace", r)
	}
	if err := c.SetLockPolicy(t.Context(), "graced", lockd.LockPolicy{RevokeGrace: time.Minute}); err != nil {
		t.Fatal(err)
	}
	adminAt := time.Now()
	requestRelease(t, c, "graced", "admin") // authentication off: an admin's
	r := nextNotice(t, ch)
	if r.RevokeGrace != time.Minute || r.Token != m.Token() {
		t.Fatalf("notice after the admin's request %+v, want a grace of 1m for token %d", r, m.Token())
	}
	// The grace counts from the admin's request, not from the first one.
	if r.RevokeAt.Before(adminAt.Add(time.Minute)) || !r.RequestedAt.Before(adminAt) {
		t.Fatalf("notice %+v: revoke at %v, want a minute after the admin's request (%v), and the first request's time", r, r.RevokeAt, adminAt)
	}
	requestRelease(t, c, "graced", "third")
	select {
	case r := <-ch:
		t.Fatalf("a third notice %+v for the same hold and grace", r)
	case <-time.After(200 * time.Millisecond): // a notice would have come by now: the second did
	}
}

// Unlock drops a notice of the hold it ends that nobody read.
func TestReleaseRequestedDrainedOnUnlock(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	m := newSession(t, c).NewMutex("drained")
	ch := m.ReleaseRequested()
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	requestRelease(t, c, "drained", "unread")
	for end := time.Now().Add(15 * time.Second); len(ch) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no notice within 15 s")
		}
	}
	if err := m.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(ch) != 0 {
		t.Fatalf("an unread notice of the released hold stayed: %+v", <-ch)
	}
}

// Close waits for the client's notice goroutines (subscriptions, or the
// watches with the stream off): none is left once it returns, and the
// client leaks none.
func TestReleaseRequestedCloseLeaksNothing(t *testing.T) {
	srv := lockdtest.New(t)
	ignore := goleak.IgnoreCurrent()
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	m := newSession(t, c).NewMutex("leak")
	ch := m.ReleaseRequested()
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	requestRelease(t, c, "leak", "bye")
	nextNotice(t, ch)
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "noticeHub") {
		t.Fatalf("a notice goroutine outlived Close:\n%s", st)
	}
	// The in-process server's goroutines are not the client's; nor is the
	// HTTP/2 connection's reader, which a client without notices leaves
	// too (the connection is closed when idle, and the stream just ended
	// may keep it busy past CloseIdleConnections).
	goleak.VerifyNone(t, ignore,
		goleak.IgnoreAnyFunction("net/http.(*http2serverConn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*http2serverConn).readFrames"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("github.com/lockd-dev/lockd/internal/node.(*Node).untilClosed.func1"),
		goleak.IgnoreAnyFunction("github.com/lockd-dev/lockd/internal/node.versionGate.probeVersions"),
		goleak.IgnoreAnyFunction("github.com/lockd-dev/lockd/internal/node.versionGate.probeVersions.func1"),
		goleak.IgnoreAnyFunction("github.com/lockd-dev/lockd/internal/node.versionGate.probeVersions.func2"))
}
