package lockd_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// metric returns the value of one sample of the server's /metrics, e.g.
// `lockd_api_stream_frames_total{kind="acquire"}`, or 0 when absent.
func metric(t testing.TB, srvURL, sample string) float64 {
	t.Helper()
	resp, err := http.Get(srvURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

func frames(t testing.TB, srvURL, kind string) float64 {
	return metric(t, srvURL, `lockd_api_stream_frames_total{kind="`+kind+`"}`)
}

func unaryCalls(t testing.TB, srvURL, method string) float64 {
	return metric(t, srvURL, `lockd_api_requests_total{code="ok",method="/lockd.v1.LockService/`+method+`"}`)
}

func TestStreamCarriesSessionCalls(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv, lockd.WithStream(true))
	a, b := newSession(t, c), newSession(t, c)
	ma, mb := a.NewMutex("invoices"), b.NewMutex("invoices")
	if err := ma.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- mb.Lock(t.Context()) }()
	waitQueue(t, c, "invoices", 1)
	if err := ma.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("queued Lock = %v, want the grant", err)
	}
	if mb.Token() <= ma.Token() {
		t.Errorf("token %d after %d", mb.Token(), ma.Token())
	}
	if err := mb.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	for kind, min := range map[string]float64{"create_session": 2, "acquire": 2, "release": 2} {
		if n := frames(t, srv.URL(), kind); n < min {
			t.Errorf("%s frames = %v, want >= %v", kind, n, min)
		}
	}
	for _, m := range []string{"CreateSession", "Acquire", "Release", "KeepAlive"} {
		if n := unaryCalls(t, srv.URL(), m); n != 0 {
			t.Errorf("%v unary %s calls beside the stream", n, m)
		}
	}
	if n := metric(t, srv.URL(), "lockd_api_streams_open"); n != 1 {
		t.Errorf("%v streams open, want 1 (one per client and endpoint)", n)
	}
}

// A stream cut while an Acquire waits in the queue: the client re-sends
// the same seq on a new stream and gets the one grant the server made, no
// second one and no lost one.
func TestStreamBrokenMidAcquireKeepsOneGrant(t *testing.T) {
	srv := lockdtest.New(t)
	direct := newClient(t, srv)
	p := newFaultProxy(t, srv.Addr().String())
	viaProxy := newClient(t, srv, lockd.WithEndpoints(p.URL()), lockd.WithStream(true))
	holder := newSession(t, direct)
	waiter := newSession(t, viaProxy, lockd.WithTTL(time.Minute))
	mh, mw := holder.NewMutex("payroll"), waiter.NewMutex("payroll")
	if err := mh.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- mw.Lock(t.Context()) }()
	waitQueue(t, direct, "payroll", 1)
	before := frames(t, srv.URL(), "acquire")
	p.cut()
	// The re-sent acquire arrives on a new stream (same seq, so it does not
	// queue twice: the queue still has one waiter).
	deadline := time.Now().Add(10 * time.Second)
	for frames(t, srv.URL(), "acquire") == before {
		if time.Now().After(deadline) {
			t.Fatal("the cut acquire was not re-sent")
		}
	}
	if w := waitQueue(t, direct, "payroll", 1); w[0].GetSessionId() != waiter.ID() {
		t.Fatalf("waiter %s, want %s", w[0].GetSessionId(), waiter.ID())
	}
	if err := mh.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Lock after a cut stream = %v", err)
	}
	l := describe(t, direct, "payroll")
	if len(l.GetHolders()) != 1 || l.GetHolders()[0].GetSessionId() != waiter.ID() || l.GetHolders()[0].GetToken() != mw.Token() || len(l.GetWaiters()) != 0 {
		t.Fatalf("lock %v, want one hold by %s with token %d", l, waiter.ID(), mw.Token())
	}
	if err := mw.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A reverse proxy that speaks HTTP/1.1 only. One that passes upgrades
// (httputil's does, as nginx does when told to) carries the stream on an
// upgraded connection; behind one that drops them the client cannot open
// a stream and uses unary calls.
func TestStreamThroughHTTP1Proxy(t *testing.T) {
	for _, passes := range []bool{true, false} {
		t.Run(map[bool]string{true: "passes upgrades", false: "drops upgrades"}[passes], func(t *testing.T) {
			srv := lockdtest.New(t)
			u, err := url.Parse(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			rp := httputil.NewSingleHostReverseProxy(u)
			proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !passes {
					r.Header.Del("Upgrade")
				}
				rp.ServeHTTP(w, r)
			}))
			t.Cleanup(proxy.Close)
			c := newClient(t, srv, lockd.WithEndpoints(proxy.URL), lockd.WithStream(true))
			s := newSession(t, c)
			m := s.NewMutex("reports")
			if err := m.Lock(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := m.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			streamed := frames(t, srv.URL(), "acquire") + frames(t, srv.URL(), "create_session")
			unary := unaryCalls(t, srv.URL(), "Acquire")
			if passes && (streamed != 2 || unary != 0) {
				t.Errorf("%v frames and %v unary acquires through a proxy that passes upgrades, want 2 and 0", streamed, unary)
			}
			if !passes && (streamed != 0 || unary != 1) {
				t.Errorf("%v frames and %v unary acquires through a proxy that drops upgrades, want 0 and 1", streamed, unary)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// 100 sessions of one client are kept alive by one batch per round (one
// frame, one leadership check), not one call each.
func TestStreamBatchesKeepAlives(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv, lockd.WithStream(true))
	const n = 100
	var sessions []*lockd.Session
	for range n {
		sessions = append(sessions, newSession(t, c, lockd.WithTTL(time.Second)))
	}
	// Five rounds (TTL/3 each) of 100 keepalives.
	deadline := time.Now().Add(20 * time.Second)
	for metric(t, srv.URL(), "lockd_session_keepalives_total") < 5*n {
		if time.Now().After(deadline) {
			t.Fatal("keepalives did not reach five rounds")
		}
	}
	// The sessions were created over some time: the first rounds may take
	// a few batches; after them, all renew in step, one frame per round.
	k0, b0 := metric(t, srv.URL(), "lockd_session_keepalives_total"), frames(t, srv.URL(), "keep_alive")
	for metric(t, srv.URL(), "lockd_session_keepalives_total") < k0+3*n {
		if time.Now().After(deadline) {
			t.Fatal("keepalives did not reach three more rounds")
		}
	}
	k1, b1 := metric(t, srv.URL(), "lockd_session_keepalives_total"), frames(t, srv.URL(), "keep_alive")
	if rounds := (k1 - k0) / n; b1-b0 > rounds+1 {
		t.Errorf("%v keepalive frames for %v keepalives of %d sessions (%.1f rounds): not one batch per round", b1-b0, k1-k0, n, rounds)
	}
	t.Logf("steady state: %v keepalives in %v frames", k1-k0, b1-b0)
	if u := unaryCalls(t, srv.URL(), "KeepAlive"); u != 0 {
		t.Errorf("%v unary keepalives beside the stream", u)
	}
	for _, s := range sessions {
		if s.Err() != nil {
			t.Fatalf("session lost: %v", s.Err())
		}
	}
}

// Unary fallback keeps each session's own KeepAlive.
func TestStreamOffKeepsUnaryKeepAlives(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv, lockd.WithStream(false))
	s := newSession(t, c, lockd.WithTTL(300*time.Millisecond))
	deadline := time.Now().Add(10 * time.Second)
	for unaryCalls(t, srv.URL(), "KeepAlive") < 3 {
		if time.Now().After(deadline) {
			t.Fatal("no unary keepalives")
		}
	}
	if f := frames(t, srv.URL(), "keep_alive") + frames(t, srv.URL(), "create_session"); f != 0 {
		t.Errorf("%v frames with the stream off", f)
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
}

// Many Locks parked on one stream (each a long poll on the server) must not
// hold up the other calls of that stream: the holder's Release, on the same
// client, goes through at once and the next waiter is granted.
func TestStreamParkedAcquiresDoNotBlockRelease(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv, lockd.WithStream(true))
	holder := newSession(t, c).NewMutex("busy")
	if err := holder.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	const waiters = 300 // more than the server serves at once per stream
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	granted := make(chan *lockd.Mutex, waiters)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range waiters {
		m := newSession(t, c).NewMutex("busy")
		wg.Go(func() {
			if m.Lock(ctx) == nil {
				granted <- m
			}
		})
	}
	waitQueue(t, c, "busy", 128)
	rctx, rcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer rcancel()
	if err := holder.Unlock(rctx); err != nil {
		t.Fatalf("release behind parked acquires: %v", err)
	}
	select {
	case m := <-granted:
		if err := m.Unlock(rctx); err != nil {
			t.Fatal(err)
		}
	case <-rctx.Done():
		t.Fatal("no waiter granted after the release")
	}
}
