package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	lockdapi "github.com/lockd-dev/lockd/internal/api"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// sseBrowser is a dashboard-like consumer of the SSE watch with state=1,
// reconnecting as a browser's EventSource does: the same URL, with
// Last-Event-ID set to the last id it received (none if it received none).
// It keeps the held locks the way docs/events.md tells a browser to: it
// collects the held events since the stream opened or the last reset, and
// replaces its state with them at synced; changes apply to the state.
type sseBrowser struct {
	t       *testing.T
	url     string
	lastID  string
	state   map[string]string // lock name -> token
	pending map[string]string
	body    io.Closer
	r       *bufio.Reader
}

// open connects (or reconnects), as EventSource does.
func (b *sseBrowser) open(ctx context.Context) {
	b.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.url, nil)
	if b.lastID != "" {
		req.Header.Set("Last-Event-ID", b.lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		b.t.Fatalf("GET %s (Last-Event-ID %q): %s", b.url, b.lastID, resp.Status)
	}
	b.body, b.r = resp.Body, bufio.NewReader(resp.Body)
	b.pending = map[string]string{} // the open event: a dump starts over
}

// drop breaks the connection.
func (b *sseBrowser) drop() { b.body.Close() }

// next reads and handles one message, by the rules of the SSE parser: an
// id line sets the last id (an empty one clears it) when its message is
// dispatched. It returns the message's event type ("message" for data
// without one) or "comment".
func (b *sseBrowser) next() string {
	b.t.Helper()
	var event, data string
	id, hasID, hasData := "", false, false
	for {
		line, err := b.r.ReadString('\n')
		if err != nil {
			b.t.Fatalf("stream ended: %v", err)
		}
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, ":") {
			return "comment"
		}
		if line != "" {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimPrefix(v, " ")
			switch k {
			case "event":
				event = v
			case "id":
				id, hasID = v, true
			case "data":
				data, hasData = v, true
			}
			continue
		}
		if hasID {
			b.lastID = id
		}
		if !hasData {
			continue // nothing to dispatch
		}
		if event == "" {
			event = "message"
		}
		switch event {
		case "reset":
			b.pending = map[string]string{}
		case "synced":
			b.state, b.pending = b.pending, map[string]string{}
		case "message":
			var ev lockdv1.WatchResponse
			if err := protojson.Unmarshal([]byte(data), &ev); err != nil {
				b.t.Fatalf("data %q: %v", data, err)
			}
			tok := fmt.Sprint(ev.Token)
			switch ev.Kind {
			case lockdv1.EventKind_EVENT_KIND_HELD:
				b.pending[ev.Name] = tok
			case lockdv1.EventKind_EVENT_KIND_GRANTED:
				b.state[ev.Name] = tok
			case lockdv1.EventKind_EVENT_KIND_RELEASED, lockdv1.EventKind_EVENT_KIND_EXPIRED,
				lockdv1.EventKind_EVENT_KIND_FORCE_RELEASED, lockdv1.EventKind_EVENT_KIND_COMPLETED:
				if b.state[ev.Name] == tok {
					delete(b.state, ev.Name)
				}
			}
		}
		return event
	}
}

// settle reads until the state is synced or the stream idles (a second
// keepalive: the first one opens a resumed stream).
func (b *sseBrowser) settle() {
	b.t.Helper()
	comments := 0
	for {
		switch b.next() {
		case "synced":
			return
		case "comment":
			if comments++; comments == 2 {
				return
			}
		}
	}
}

// A browser whose SSE watch with state=1 breaks in the middle of the state
// dump — the first one, or the one after a reset — and reconnects as
// EventSource does (Last-Event-ID: the last id it got) ends up with the
// whole state, never a part of it.
func TestWatchSSEReconnectMidDump(t *testing.T) {
	t.Cleanup(lockdapi.SetWatchKeepalive(100 * time.Millisecond))
	opts := defaultClusterOpts()
	opts.history = 8
	c := newTestCluster(t, 1, opts)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cl := c.newClient("w")
	s, err := cl.NewSession(ctx, lockd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	locks := map[string]*lockd.Mutex{}
	take := func(names ...string) {
		for _, n := range names {
			m := s.NewMutex(n)
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			locks[n] = m
		}
	}
	take("dump/0", "dump/1", "dump/2", "dump/3", "dump/4", "dump/5")
	br := &sseBrowser{t: t, url: c.nodes[0].url + "/v1/watch?prefix=dump/&state=1"}
	check := func(when string) {
		t.Helper()
		want := map[string]string{}
		for n, m := range locks {
			want[n] = fmt.Sprint(m.Token())
		}
		if !maps.Equal(br.state, want) {
			t.Fatalf("%s: the browser knows %d held locks %v, the cluster holds %d: %v", when, len(br.state), br.state, len(want), want)
		}
	}

	// The first dump, cut after two of its six holds.
	br.open(ctx)
	for held := 0; held < 2; {
		if br.next() == "message" {
			held++
		}
	}
	br.drop()
	br.open(ctx)
	br.settle()
	check("after a reconnect during the first dump")

	// A break while the browser is behind the history: the reconnect gets
	// a reset and a dump, cut after two holds, and reconnects again.
	br.drop()
	for _, n := range []string{"dump/0", "dump/1", "dump/2"} {
		if err := locks[n].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		delete(locks, n)
	}
	take("dump/6", "dump/7", "dump/8")
	churn(t, ctx, cl, "other", 8) // the browser's position leaves the history
	br.open(ctx)
	for held := 0; held < 2; {
		switch br.next() {
		case "message":
			held++
		case "synced":
			t.Fatal("synced before two holds")
		}
	}
	br.drop()
	br.open(ctx)
	br.settle()
	check("after a reconnect during the dump after a reset")

	// And the stream goes on from there: a change arrives, and a plain
	// reconnect (after a change's id) resumes exactly.
	if err := locks["dump/3"].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	delete(locks, "dump/3")
	for br.next() != "message" {
	}
	check("after a change")
	br.drop()
	take("dump/9")
	br.open(ctx)
	for br.next() != "message" {
	}
	check("after a reconnect after a change")
	br.drop()
}

// tagged is the position p ("INDEX.N") in s's cluster, as s gives it.
func tagged(s *Server, p string) string { return p + "@" + node.ClusterTag(s.fsm.ClusterID()) }

// A position saved from cluster A and resumed against cluster B, restored
// from A's backup (a new cluster id, a log as long as A's and longer), gets
// a reset (and, with WatchState, the state), not the events after that
// index in B's log with the ones before it silently skipped.
func TestWatchForeignPositionResets(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	a := startServer(t, testConfig(t.TempDir()))
	defer a.Close()
	ca, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(a.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	churn(t, ctx, ca, "f/a", 5)
	evs := collect(t, ctx, ca, "f/", 10, lockd.WatchFrom("0.0"))
	saved := evs[len(evs)-1].Position
	if !strings.HasSuffix(saved, "@"+node.ClusterTag(a.fsm.ClusterID())) {
		t.Fatalf("position %q does not carry cluster %s", saved, a.fsm.ClusterID())
	}

	file := downloadBackup(t, a)
	cfg := testConfig(t.TempDir())
	cfg.Restore = file
	b := startServer(t, cfg)
	defer b.Close()
	cb, err := lockd.New(lockd.WithStream(streamOn()), lockd.WithEndpoints(b.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	s, err := cb.NewSession(ctx, lockd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held := s.NewMutex("f/held")
	if err := held.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// B's log passes the saved index, with events under f/ before and
	// after it: the ones a resume from it would skip and deliver.
	for b.hub.Now().Index <= mustPos(t, saved).Index+4 {
		churn(t, ctx, cb, "f/b", 2)
	}

	for _, state := range []bool{false, true} {
		opts := []lockd.WatchOption{lockd.WatchFrom(saved)}
		if state {
			opts = append(opts, lockd.WatchState())
		}
		var kinds []lockd.EventKind
		var first lockd.Event
		for ev, err := range cb.Watch(ctx, "f/", opts...) {
			if len(kinds) == 0 {
				first = ev
				if ev.Kind != lockd.EventReset || !errors.Is(err, lockd.ErrWatchReset) {
					t.Fatalf("state=%v: first event %v at %s (%v) from another cluster's position %s, want a reset", state, ev.Kind, ev.Position, err, saved)
				}
			} else if err != nil {
				t.Fatalf("state=%v: after the reset: %v", state, err)
			}
			kinds = append(kinds, ev.Kind)
			if !state || ev.Kind == lockd.EventSynced {
				break
			}
			if ev.Kind == lockd.EventHeld && (ev.Name != "f/held" || ev.Token != held.Token()) {
				t.Fatalf("state: held %s token %d, want f/held token %d", ev.Name, ev.Token, held.Token())
			}
		}
		if !strings.HasSuffix(first.Position, "@"+node.ClusterTag(b.fsm.ClusterID())) {
			t.Fatalf("reset position %q is not of cluster %s", first.Position, b.fsm.ClusterID())
		}
		if want := []lockd.EventKind{lockd.EventReset, lockd.EventHeld, lockd.EventSynced}; state && !slices.Equal(kinds, want) {
			t.Fatalf("with state: %v, want %v", kinds, want)
		}
	}
}

// Which positions a node takes as they are and which get a reset first.
func TestWatchPositionCluster(t *testing.T) {
	s := startServer(t, testConfig(t.TempDir()))
	defer s.Close()
	own := node.ClusterTag(s.fsm.ClusterID())
	for _, tc := range []struct {
		from  string
		reset bool
		bad   bool
	}{
		{from: "5.1@" + own},
		{from: "0.0"},                  // from the start: the same in every cluster
		{from: "0.0@0123456789abcdef"}, // likewise
		{from: "5.1", reset: true},     // no tag: from before the tag, or by hand
		{from: "5.1@0123456789abcdef", reset: true},
		{from: "reset", reset: true},
		{from: "5.1@", bad: true},
		{from: "5.1@XYZ", bad: true},
		{from: "5", bad: true},
	} {
		_, reset, err := s.api.Hooks().ParseFrom(tc.from)
		if bad := errors.Is(err, node.ErrBadPosition); bad != tc.bad || err != nil && !bad || reset != tc.reset {
			t.Errorf("from %q: reset %v, err %v; want reset %v, bad %v", tc.from, reset, err, tc.reset, tc.bad)
		}
	}
}
