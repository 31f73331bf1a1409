package lockd

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

func noticeClient(t *testing.T) *Client {
	t.Helper()
	srv := lockdtest.New(t)
	c, err := New(WithStream(lockdtest.Stream()), WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(t.Context()) })
	return c
}

// noticeHandles returns how many handles the client's notice hub knows.
func noticeHandles(c *Client) int {
	c.notices.mu.Lock()
	defer c.notices.mu.Unlock()
	n := 0
	for _, ls := range c.notices.locks {
		n += len(ls)
	}
	return n
}

// The hub knows a handle only while it holds: a long-lived session that
// takes a new lock per job, each asked for its notices, does not grow it
// (nor, with the stream off, watch every name it ever held).
func TestNoticeHubTracksCurrentHoldsOnly(t *testing.T) {
	c := noticeClient(t)
	s, err := c.NewSession(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		m := s.NewMutex(fmt.Sprintf("job/%d", i))
		m.ReleaseRequested()
		if n := noticeHandles(c); n != 0 {
			t.Fatalf("job %d: the hub knows %d handles before the lock is taken, want 0", i, n)
		}
		if err := m.Lock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := noticeHandles(c); n != 1 {
			t.Fatalf("job %d: the hub knows %d handles while one is held", i, n)
		}
		if err := m.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	set := s.NewMultiLock([]string{"set/a", "set/b"})
	set.ReleaseRequested()
	if err := set.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := set.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := noticeHandles(c); n != 0 {
		t.Fatalf("the hub knows %d handles after every hold ended, want 0", n)
	}
}

// A notice that reaches a MultiLock between the server's grant and the
// grant's install (the stream's reader runs apart from the acquire) is
// kept and delivered once the set is held, as a single lock's is.
func TestMultiLockEarlyNotice(t *testing.T) {
	c := noticeClient(t)
	s, err := c.NewSession(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m := s.NewMultiLock([]string{"early/a", "early/b"})
	ch := m.ReleaseRequested()
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	tokens := m.Tokens()
	// Back to the moment before the install: acquiring, the server's
	// grant in hand.
	m.mu.Lock()
	m.h, m.busy = nil, true
	m.mu.Unlock()
	c.notices.deliver(&lockdv1.ReleaseRequested{SessionId: s.id, Name: "early/b", Token: tokens["early/b"], Reason: "early"})
	resp := &lockdv1.AcquireManyResponse{}
	for _, n := range m.Names() {
		resp.Grants = append(resp.Grants, &lockdv1.LockGrant{Name: n, Token: tokens[n]})
	}
	if err := m.granted(resp, time.Now()); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.busy = false
	m.mu.Unlock()
	select {
	case r := <-ch:
		if r.Name != "early/b" || r.Token != tokens["early/b"] || r.Reason != "early" {
			t.Fatalf("notice %+v, want early/b's", r)
		}
	default:
		t.Fatal("the notice that came before the grant's install was dropped")
	}
}

// Failed subscriptions and watches (a refused read permission) are tried
// again after a pause that doubles up to a minute, and starts over once
// one works.
func TestNoticeBackoff(t *testing.T) {
	var b backoff
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		if d := b.wait(); d != w {
			t.Fatalf("wait %d = %v, want %v", i, d, w)
		}
	}
	b.reset()
	if d := b.wait(); d != noticeRetry {
		t.Fatalf("wait after reset = %v, want %v", d, noticeRetry)
	}
}
