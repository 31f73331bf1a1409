package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// watchStandIn serves GET /v1/watch by the contract of the watch stream
// (docs/events.md): text/event-stream, one "data:" JSON
// event per message, "event: reset" to restart, ": keepalive" comments.
// It is a stand-in until that stream is merged; TestDashboardFeedLive
// checks the same page against the real one.
type watchStandIn struct {
	mu       sync.Mutex
	conns    []chan string
	prefixes []string
	done     chan struct{}
}

func (w *watchStandIn) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	ch := make(chan string, 16)
	w.mu.Lock()
	w.conns = append(w.conns, ch)
	w.prefixes = append(w.prefixes, r.URL.Query().Get("prefix"))
	w.mu.Unlock()
	rw.Header().Set("Content-Type", "text/event-stream")
	rw.Header().Set("Cache-Control", "no-store")
	rw.WriteHeader(http.StatusOK)
	fmt.Fprint(rw, ": keepalive\n\n")
	rw.(http.Flusher).Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-w.done:
			return
		case msg := <-ch:
			fmt.Fprint(rw, msg)
			rw.(http.Flusher).Flush()
		}
	}
}

// send writes a message to the newest stream.
func (w *watchStandIn) send(msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.conns) > 0 {
		w.conns[len(w.conns)-1] <- msg
	}
}

func (w *watchStandIn) lastPrefix() (string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.prefixes) == 0 {
		return "", 0
	}
	return w.prefixes[len(w.prefixes)-1], len(w.prefixes)
}

// TestDashboardFeedFollowsWatchContract: against a stand-in of the watch
// stream (in front of a real server), the feed shows each event with its
// kind stripped of EVENT_KIND_ and lower-cased, an event refreshes the
// tables at once (polling is set to a minute here), a reset is shown, and
// the prefix filter reconnects the stream with that prefix.
func TestDashboardFeedFollowsWatchContract(t *testing.T) {
	srv := lockdtest.New(t)
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	watch := &watchStandIn{done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("GET /v1/watch", watch)
	mux.Handle("/", httputil.NewSingleHostReverseProxy(target))
	front := httptest.NewServer(mux)
	t.Cleanup(front.Close)
	t.Cleanup(func() { close(watch.done) })
	ctx := browser(t, 1000, 800)
	c := &client{t: t, svc: lockdv1connect.NewLockServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(lockdtest.Secrets()))}

	if err := chromedp.Do(ctx, chromedp.Navigate(front.URL+"/ui/?refresh=60000")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the stream open", `document.getElementById("events-state").textContent === "live" && window.lockdStats.updates >= 1`)

	s := c.session("feeder@host", time.Minute)
	g := c.acquire(&lockdv1.AcquireRequest{SessionId: s, Seq: 1, Name: "feed/a"})
	watch.send(fmt.Sprintf(`data: {"position":"p1","kind":"EVENT_KIND_GRANTED","name":"feed/a","session":%q,"owner":"feeder@host","token":"%d","mode":"MODE_EXCLUSIVE"}`+"\n\n", s, g.Token))
	poll(t, ctx, "the event in the feed", fmt.Sprintf(`document.querySelector("#events li") && document.querySelector("#events li").innerText.includes("granted feed/a") && document.querySelector("#events li").innerText.includes("#%d")`, g.Token))
	// Polling is a minute away: only the event can have refreshed the table.
	poll(t, ctx, "the table refreshed by the event", `document.querySelector('tr[data-lock="feed/a"]') !== null`)

	watch.send("event: reset\ndata: {\"position\":\"p9\"}\n\n")
	poll(t, ctx, "the reset in the feed", `document.querySelector("#events li").innerText.includes("reset")`)

	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`(() => { const i = document.getElementById("prefix"); i.value = "feed/"; i.dispatchEvent(new Event("input")); })()`)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if p, n := watch.lastPrefix(); p == "feed/" && n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			p, n := watch.lastPrefix()
			t.Fatalf("after the prefix filter: %d streams, the last with prefix %q; want a new one with prefix feed/", n, p)
		}
		time.Sleep(20 * time.Millisecond) // polling what the browser did
	}
}

// TestDashboardFeedLive: with the real watch stream on the server, a grant
// appears in the feed. It skips while the server has no watch stream.
func TestDashboardFeedLive(t *testing.T) {
	srv := lockdtest.New(t)
	ctx0, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx0, http.MethodGet, srv.URL()+"/v1/watch?prefix=live/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Skipf("the server has no watch stream yet (GET /v1/watch: %s)", resp.Status)
	}
	cancel()
	ctx := browser(t, 1000, 800)
	c := &client{t: t, svc: lockdv1connect.NewLockServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(lockdtest.Secrets()))}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL()+"/ui/?refresh=60000&prefix=live/")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the stream open", `document.getElementById("events-state").textContent === "live"`)
	s := c.session("live@host", time.Minute)
	c.acquire(&lockdv1.AcquireRequest{SessionId: s, Seq: 1, Name: "live/x"})
	poll(t, ctx, "the grant in the feed", `[...document.querySelectorAll("#events li")].some((li) => li.innerText.includes("granted live/x"))`)
	poll(t, ctx, "the table refreshed by the event", `document.querySelector('tr[data-lock="live/x"]') !== null`)
}
