package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	lockdapi "github.com/lockd-dev/lockd/internal/api"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// churn takes and releases a mutex on name n times: 2n events (granted,
// released), and returns the tokens in order.
func churn(t *testing.T, ctx context.Context, cl *lockd.Client, name string, n int) []uint64 {
	t.Helper()
	s, err := cl.NewSession(ctx, lockd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	var tokens []uint64
	for range n {
		m := s.NewMutex(name)
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, m.Token())
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return tokens
}

// collect reads n events (no reset expected) from a watch.
func collect(t *testing.T, ctx context.Context, cl *lockd.Client, prefix string, n int, opts ...lockd.WatchOption) []lockd.Event {
	t.Helper()
	var out []lockd.Event
	for ev, err := range cl.Watch(ctx, prefix, opts...) {
		if err != nil {
			t.Fatalf("watch after %d events: %v", len(out), err)
		}
		out = append(out, ev)
		if len(out) == n {
			break
		}
	}
	return out
}

// checkChurn checks that evs are exactly the granted/released pairs of
// tokens, in order, with strictly increasing positions.
func checkChurn(t *testing.T, evs []lockd.Event, tokens []uint64) {
	t.Helper()
	if len(evs) != 2*len(tokens) {
		t.Fatalf("got %d events, want %d", len(evs), 2*len(tokens))
	}
	var last node.Pos
	for i, ev := range evs {
		want := lockd.EventGranted
		if i%2 == 1 {
			want = lockd.EventReleased
		}
		if ev.Kind != want || ev.Token != tokens[i/2] {
			t.Fatalf("event %d: %v token %d, want %v token %d", i, ev.Kind, ev.Token, want, tokens[i/2])
		}
		p, err := node.ParsePos(ev.Position)
		if err != nil {
			t.Fatal(err)
		}
		if !last.Less(p) {
			t.Fatalf("event %d: position %v not after %v", i, p, last)
		}
		last = p
	}
}

// A watcher cut in the middle of 1 000 events (once by the caller, once by
// its node going down) resumes from its last position and receives every
// event exactly once, in order; followers and the leader give the same
// sequence.
func TestWatchResumeExactlyOnce(t *testing.T) {
	c := newTestCluster(t, 3, defaultClusterOpts())
	l, err := c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f1, f2 := (l+1)%3, (l+2)%3
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// The writer talks to the leader only: stopping a follower must not
	// cost it its session on a loaded machine.
	writer := c.newClient("writer", lockd.WithEndpoints(c.nodes[l].url))
	watcher := c.newClient("watcher", lockd.WithEndpoints(c.nodes[f1].url, c.nodes[f2].url))

	// The first 400 events, read as they come, then the caller stops.
	first := make(chan []lockd.Event, 1)
	go func() {
		var out []lockd.Event
		for ev, err := range watcher.Watch(ctx, "w/", lockd.WatchFrom("0.0")) {
			if err != nil {
				t.Errorf("watch: %v", err)
				break
			}
			if out = append(out, ev); len(out) == 400 {
				break
			}
		}
		first <- out
	}()
	tokens := churn(t, ctx, writer, "w/a", 250)
	got := <-first
	// Resume after the last one seen, while the writer goes on; halfway,
	// the node serving the watch goes down and the client moves on.
	rest := make(chan []lockd.Event, 1)
	go func() {
		var out []lockd.Event
		for ev, err := range watcher.Watch(ctx, "w/", lockd.WatchFrom(got[len(got)-1].Position)) {
			if err != nil {
				t.Errorf("resumed watch: %v", err)
				break
			}
			if out = append(out, ev); len(out) == 600 {
				break
			}
		}
		rest <- out
	}()
	tokens = append(tokens, churn(t, ctx, writer, "w/a", 100)...)
	serving := f1
	for gauge(c.server(f1).api.Hooks().WatchStreams()) == 0 && gauge(c.server(f2).api.Hooks().WatchStreams()) == 0 {
		time.Sleep(5 * time.Millisecond) // between the first watch and the second
	}
	if gauge(c.server(f1).api.Hooks().WatchStreams()) == 0 {
		serving, f2 = f2, f1
	}
	c.stop(serving, true)
	tokens = append(tokens, churn(t, ctx, writer, "w/a", 150)...)
	got = append(got, <-rest...)
	checkChurn(t, got, tokens)

	// Every node that is up gives the same sequence from the start.
	all := collect(t, ctx, c.newClient("leader-watch", lockd.WithEndpoints(c.nodes[l].url)), "w/", 1000, lockd.WatchFrom("0.0"))
	follower := collect(t, ctx, c.newClient("follower-watch", lockd.WithEndpoints(c.nodes[f2].url)), "w/", 1000, lockd.WatchFrom("0.0"))
	if !slices.EqualFunc(all, follower, eventsEqual) {
		t.Fatal("the follower's sequence differs from the leader's")
	}
	if !slices.EqualFunc(all, got, eventsEqual) {
		t.Fatal("the resumed sequence differs from the leader's")
	}
}

// gauge reads a gauge.
func gauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

func eventsEqual(a, b lockd.Event) bool {
	return a.Position == b.Position && a.Kind == b.Kind && a.Name == b.Name && a.Session == b.Session &&
		a.Owner == b.Owner && a.Token == b.Token && a.Shared == b.Shared && a.Limit == b.Limit && string(a.Value) == string(b.Value)
}

// A position older than the node's history gets a reset (ErrWatchReset),
// then the events after the reset's position.
func TestWatchResetFromCompacted(t *testing.T) {
	opts := defaultClusterOpts()
	opts.history = 16
	c := newTestCluster(t, 1, opts)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cl := c.newClient("w")
	churn(t, ctx, cl, "r/a", 20) // 40 events: the first 24 are gone
	next := make(chan []uint64, 1)
	var evs []lockd.Event
	var errs []error
	for ev, err := range cl.Watch(ctx, "r/b", lockd.WatchFrom(tagged(c.server(0), "1.0"))) {
		evs, errs = append(evs, ev), append(errs, err)
		if len(evs) == 1 {
			// The reset goes on from the head it saw: only now make the
			// events that must follow it (made earlier, on a busy
			// machine, they could land before that head).
			go func() { next <- churn(t, ctx, cl, "r/b", 1) }()
		}
		if len(evs) == 3 {
			break
		}
	}
	if evs[0].Kind != lockd.EventReset || !errors.Is(errs[0], lockd.ErrWatchReset) {
		t.Fatalf("first event %v, %v; want a reset", evs[0].Kind, errs[0])
	}
	checkChurn(t, evs[1:], <-next)
	if p, _ := node.ParsePos(evs[0].Position); !p.Less(mustPos(t, evs[1].Position)) {
		t.Fatalf("reset position %s not before the next event's %s", evs[0].Position, evs[1].Position)
	}
}

func mustPos(t *testing.T, s string) node.Pos {
	t.Helper()
	p, err := node.ParsePos(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A consumer that stops reading does not make the node keep more: the
// history stays at its size and the stream at its buffer; when the
// consumer reads again, it gets a reset. The stall is the stream's send
// blocking, as on a full socket (a real socket's kernel buffers would
// absorb thousands of events first, which is not deterministic).
func TestWatchStalledConsumer(t *testing.T) {
	opts := defaultClusterOpts()
	opts.history = 32
	c := newTestCluster(t, 1, opts)
	s := c.server(0)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cl := c.newClient("w")

	stall := make(chan struct{})
	sent := make(chan *lockdv1.WatchResponse, 1000)
	done := make(chan error, 1)
	go func() {
		first := true
		done <- s.api.Hooks().StreamEvents(ctx, "s/", "", false, func(ev *lockdv1.WatchResponse) error {
			sent <- ev
			if first {
				first = false
				<-stall // the consumer stops reading after the first event
			}
			return nil
		}, func(string) error { return nil })
	}()
	churn(t, ctx, cl, "s/a", 200) // 400 events, 12 histories' worth
	if n := s.hub.Stored(); n > opts.history {
		t.Fatalf("history holds %d events, more than its size %d", n, opts.history)
	}
	close(stall)
	tail := churn(t, ctx, cl, "s/a", 1)
	<-sent // the event before the stall
	if ev := <-sent; ev.Kind != lockdv1.EventKind_EVENT_KIND_RESET {
		t.Fatalf("after the stall: %v, want a reset", ev.Kind)
	}
	n := 0
	for ev := range sent {
		if n++; n > opts.history+2 {
			t.Fatalf("%d events after the reset, more than the history could hold", n)
		}
		if ev.Kind == lockdv1.EventKind_EVENT_KIND_RELEASED && ev.Token == tail[0] {
			break
		}
	}
	cancel()
	<-done
}

// sseEvent is one Server-Sent Event as a browser sees it.
type sseEvent struct{ event, id, data string }

// readSSE reads the events and comments of an SSE stream to ch.
func readSSE(body *bufio.Reader, ch chan<- sseEvent) {
	defer close(ch)
	var ev sseEvent
	for {
		line, err := body.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev != (sseEvent{}) {
				ch <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			ch <- sseEvent{event: "comment", data: strings.TrimSpace(line[1:])}
		default:
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "event":
				ev.event = v
			case "id":
				ev.id = v
			case "data":
				ev.data = v
			}
		}
	}
}

// GET /v1/watch serves the same events as Server-Sent Events: protojson
// data lines, an "event: reset" for a lost position, ": keepalive"
// comments when idle.
func TestWatchSSE(t *testing.T) {
	t.Cleanup(lockdapi.SetWatchKeepalive(100 * time.Millisecond))
	opts := defaultClusterOpts()
	opts.history = 8
	c := newTestCluster(t, 1, opts)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cl := c.newClient("w")
	churn(t, ctx, cl, "old", 10) // pushes the history past position 1.0

	req, _ := http.NewRequestWithContext(ctx, "GET", c.nodes[0].url+"/v1/watch?prefix=sse/&from="+tagged(c.server(0), "1.0"), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	ch := make(chan sseEvent, 100)
	go readSSE(bufio.NewReader(resp.Body), ch)
	next := func() sseEvent {
		t.Helper()
		for ev := range ch {
			if ev.event != "comment" {
				return ev
			}
		}
		t.Fatal("stream ended")
		return sseEvent{}
	}
	reset := next()
	if reset.event != "reset" || !strings.HasPrefix(reset.data, `{"position":"`) {
		t.Fatalf("first event %+v, want a reset", reset)
	}
	s, err := cl.NewSession(ctx, lockd.WithTTL(5*time.Second), lockd.WithOwner("web-1"))
	if err != nil {
		t.Fatal(err)
	}
	m := s.NewMutex("sse/x", lockd.WithValue([]byte("v")))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := next()
	var ev lockdv1.WatchResponse
	if err := protojson.Unmarshal([]byte(got.data), &ev); err != nil {
		t.Fatalf("data %q: %v", got.data, err)
	}
	want := fmt.Sprintf(`"kind":"EVENT_KIND_GRANTED","name":"sse/x","session":%q,"owner":"web-1","token":"%d","mode":"MODE_EXCLUSIVE"`, s.ID(), m.Token())
	if !strings.Contains(got.data, want) || got.id != ev.Position {
		t.Fatalf("event %+v, want data with %s", got, want)
	}
	for _, f := range []string{`"position":`, `"kind":`, `"name":`, `"session":`, `"owner":`, `"token":`, `"mode":`} {
		if !strings.Contains(got.data, f) {
			t.Errorf("data %s has no %s", got.data, f)
		}
	}
	for ev := range ch {
		if ev.event == "comment" && ev.data == "keepalive" {
			return
		}
		t.Fatalf("got %+v while idle, want a keepalive", ev)
	}
	t.Fatal("stream ended without a keepalive")
}
