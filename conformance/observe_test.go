package conformance

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// The suite's own view of the server: a raw watch of a prefix (what the
// cluster decided, in log order) and session listings, through the
// generated Connect client, never through a client under test.

// serverWatch is a raw watch stream of one prefix.
type serverWatch struct {
	start string // the position the stream started at

	mu     sync.Mutex
	events []*lockdv1.WatchResponse
}

// watchServer opens a raw watch of prefix on s and returns once the
// stream told its start position.
func watchServer(t *testing.T, c *cluster, s *server, prefix string) *serverWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var opts []connect.ClientOption
	if c.token != "" {
		opts = append(opts, connect.WithInterceptors(bearer(c.token)))
	}
	wc := lockdv1connect.NewWatchServiceClient(http.DefaultClient, s.url(), opts...)
	st, err := wc.Watch(ctx, connect.NewRequest(&lockdv1.WatchRequest{Prefix: prefix}))
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	if !st.Receive() {
		t.Fatalf("watch: no first message: %v", st.Err())
	}
	w := &serverWatch{start: st.Msg().GetPosition()}
	if w.start == "" {
		t.Fatal("watch: the first message names no position")
	}
	go func() {
		for st.Receive() {
			if m := st.Msg(); m.GetKind() != lockdv1.EventKind_EVENT_KIND_UNSPECIFIED {
				w.mu.Lock()
				w.events = append(w.events, m)
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// list returns the events so far.
func (w *serverWatch) list() []*lockdv1.WatchResponse {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*lockdv1.WatchResponse(nil), w.events...)
}

// waitCount waits until at least n events came.
func (w *serverWatch) waitCount(t *testing.T, n int, timeout time.Duration) []*lockdv1.WatchResponse {
	t.Helper()
	var got []*lockdv1.WatchResponse
	if !pollUntil(timeout, 10*time.Millisecond, func() bool { got = w.list(); return len(got) >= n }) {
		t.Fatalf("server watch: %d events, want %d within %v", len(got), n, timeout)
	}
	return got
}

// waitFor waits until an event matching cond came and returns the events
// up to and including it.
func (w *serverWatch) waitFor(t *testing.T, timeout time.Duration, cond func(*lockdv1.WatchResponse) bool) []*lockdv1.WatchResponse {
	t.Helper()
	var got []*lockdv1.WatchResponse
	if !pollUntil(timeout, 10*time.Millisecond, func() bool {
		evs := w.list()
		for i, ev := range evs {
			if cond(ev) {
				got = evs[:i+1]
				return true
			}
		}
		return false
	}) {
		t.Fatalf("server watch: the awaited event did not come within %v (%d events)", timeout, len(w.list()))
	}
	return got
}

// sessionExpiry polls ListSessions on s until session id is gone and
// returns the last expires_at the leader reported for it (its lease
// deadline, server wall clock) and when the suite saw it gone.
func sessionExpiry(t *testing.T, c *cluster, s *server, id string, timeout time.Duration) (expires, gone time.Time) {
	t.Helper()
	api := c.api(s)
	if !pollUntil(timeout, 5*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := api.ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{}))
		if err != nil {
			return false
		}
		for _, si := range resp.Msg.GetSessions() {
			if si.GetSessionId() == id {
				if e := si.GetExpiresAt().AsTime(); si.GetExpiresAt() != nil && e.After(expires) {
					expires = e
				}
				return false
			}
		}
		gone = time.Now()
		return true
	}) {
		t.Fatalf("session %s still listed after %v", id, timeout)
	}
	return expires, gone
}

// holders returns the holders' session ids and the waiters' count of a
// lock.
func holders(t *testing.T, c *cluster, s *server, name string) (hs []string, waiters int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.api(s).DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
	if err != nil {
		t.Fatalf("describe %s: %v", name, err)
	}
	for _, h := range resp.Msg.GetLock().GetHolders() {
		hs = append(hs, h.GetSessionId())
	}
	return hs, len(resp.Msg.GetLock().GetWaiters())
}
