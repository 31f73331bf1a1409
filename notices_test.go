package lockd_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// requestRelease asks the holders of name to let go, through c's raw API.
func requestRelease(t *testing.T, c *lockd.Client, name, reason string) {
	t.Helper()
	resp, err := c.Service().RequestRelease(t.Context(), connect.NewRequest(&lockdv1.RequestReleaseRequest{Name: name, Reason: reason}))
	if err != nil {
		t.Fatalf("RequestRelease %q: %v", name, err)
	}
	if resp.Msg.GetHolders() != 1 {
		t.Fatalf("RequestRelease %q asked %d holds, want 1", name, resp.Msg.GetHolders())
	}
}

// nextNotice waits for a notice on ch.
func nextNotice(t *testing.T, ch <-chan lockd.ReleaseRequest) lockd.ReleaseRequest {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("no release-request notice within 15 s")
	}
	panic("unreachable")
}

// A Mutex's holder learns that someone asked it to let go, with the
// reason, for its current hold; a request made while the client was cut
// off (its stream broken, no new connection possible) reaches it once it
// reconnects: the server sends the pending request on the new stream (or,
// with the stream off, the client's watch reads it when it resumes).
func TestReleaseRequestedReachesHolder(t *testing.T) {
	srv := lockdtest.New(t)
	direct := newClient(t, srv)
	p := newFaultProxy(t, srv.Addr().String())
	viaProxy := newClient(t, srv, lockd.WithEndpoints(p.URL()))
	holder := newSession(t, viaProxy, lockd.WithTTL(time.Minute))
	m := holder.NewMutex("reports")
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	ch := m.ReleaseRequested()
	if m.ReleaseRequested() != ch {
		t.Fatal("ReleaseRequested returned another channel")
	}
	requestRelease(t, direct, "reports", "deploy of v2")
	r := nextNotice(t, ch)
	if r.Reason != "deploy of v2" || r.Name != "reports" || r.Token != m.Token() || r.RequestedAt.IsZero() {
		t.Fatalf("notice %+v, want reason %q for token %d", r, "deploy of v2", m.Token())
	}
	// Asked again: the same hold is not notified twice.
	requestRelease(t, direct, "reports", "again")

	if err := m.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.freeze()
	p.cut()
	requestRelease(t, direct, "reports", "drain")
	p.thaw()
	r = nextNotice(t, ch)
	if r.Reason != "drain" || r.Token != m.Token() {
		t.Fatalf("notice after reconnecting %+v, want reason %q for token %d", r, "drain", m.Token())
	}
	select {
	case r := <-ch:
		t.Fatalf("a second notice %+v", r)
	default:
	}
	sent := metric(t, srv.URL(), "lockd_api_notices_sent_total")
	if lockdtest.Stream() && sent < 2 {
		t.Errorf("%v notices sent on streams, want >= 2", sent)
	}
	if !lockdtest.Stream() && sent != 0 {
		t.Errorf("%v notices sent on streams with the stream off", sent)
	}
}

// A MultiLock hears of a request for any lock of its set, naming it; a
// Semaphore's permit holder hears of one for its own token only.
func TestReleaseRequestedSetsAndPermits(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	s := newSession(t, c)
	set := s.NewMultiLock([]string{"set/a", "set/b"})
	if err := set.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	setCh := set.ReleaseRequested()
	requestRelease(t, c, "set/b", "need b")
	if r := nextNotice(t, setCh); r.Name != "set/b" || r.Token != set.Tokens()["set/b"] || r.Reason != "need b" {
		t.Fatalf("set notice %+v, tokens %v", r, set.Tokens())
	}

	p1, p2 := newSession(t, c).NewSemaphore("pool", 2), newSession(t, c).NewSemaphore("pool", 2)
	for _, p := range []*lockd.Semaphore{p1, p2} {
		if err := p.Lock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ch1, ch2 := p1.ReleaseRequested(), p2.ReleaseRequested()
	resp, err := c.Service().RequestRelease(t.Context(), connect.NewRequest(&lockdv1.RequestReleaseRequest{Name: "pool", Reason: "shrink"}))
	if err != nil || resp.Msg.GetHolders() != 2 {
		t.Fatalf("RequestRelease: %v, %v", resp, err)
	}
	for i, pc := range []struct {
		p  *lockd.Semaphore
		ch <-chan lockd.ReleaseRequest
	}{{p1, ch1}, {p2, ch2}} {
		if r := nextNotice(t, pc.ch); r.Token != pc.p.Token() || r.Reason != "shrink" {
			t.Errorf("permit %d: notice %+v, token %d", i, r, pc.p.Token())
		}
	}
}

// A request made before the holder asks for its channel reaches it: the
// session is subscribed already (other locks of it asked first), so the
// client must have the server send the session's pending requests again
// (or, with the stream off, start the name's watch).
func TestReleaseRequestedAskedBeforeChannel(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv)
	s := newSession(t, c, lockd.WithTTL(time.Minute))
	ms := map[string]*lockd.Mutex{}
	for _, name := range []string{"a-first", "b-second", "c-third"} {
		ms[name] = s.NewMutex(name)
		if err := ms[name].Lock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	chA, chC := ms["a-first"].ReleaseRequested(), ms["c-third"].ReleaseRequested()
	requestRelease(t, c, "a-first", "warm up") // the session is subscribed and delivering
	if r := nextNotice(t, chA); r.Name != "a-first" {
		t.Fatalf("notice %+v", r)
	}
	requestRelease(t, c, "b-second", "asked before anyone listened")
	// The server sends a session's pending requests in name order, so once
	// c-third's notice is here, b-second's came and found no channel.
	requestRelease(t, c, "c-third", "marker")
	if r := nextNotice(t, chC); r.Name != "c-third" {
		t.Fatalf("notice %+v", r)
	}
	b := ms["b-second"]
	r := nextNotice(t, b.ReleaseRequested())
	if r.Name != "b-second" || r.Token != b.Token() || r.Reason != "asked before anyone listened" {
		t.Fatalf("notice %+v, want the pending request of %q", r, "b-second")
	}
}
