package main

// End-to-end tests of the API port's network guards with real `lockd
// serve` processes: the Host/Origin check against DNS rebinding (the API,
// the dashboard, the backup, the SSE watch and pprof), the quick start as
// a browser on the same machine uses it, the CLI against every documented
// address form, and the per-source connection cap under 5 000 slow
// connections.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// guardRequest sends one request to addr with Host host and the given
// headers, and returns its status and (for a non-streaming answer) body.
// from, when not "", is the local address the connection comes from.
func guardRequest(t *testing.T, from, method, addr, path, host string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		return resp.StatusCode, ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connectJSON are the headers of a Connect JSON call (the dashboard's).
var connectJSON = map[string]string{"Content-Type": "application/json", "Connect-Protocol-Version": "1"}

// TestServeHostCheck: a foreign Host (a page that rebound its name to
// 127.0.0.1) is refused on a Connect call, /ui/, the backup download, the
// SSE watch and pprof; loopback names and IP literals are served; a
// foreign Origin is refused; --allowed-hosts admits its name on the API
// and pprof. Without the guard every foreign request is answered 200.
func TestServeHostCheck(t *testing.T) {
	api, pprofAddr := freePort(t), freePort(t)
	startNode(t, filepath.Join(t.TempDir(), "data"), api, freePort(t), "/readyz",
		"--pprof-listen", pprofAddr, "--allowed-hosts", "lockd.internal")
	_, port := splitPort(t, api)
	_, pport := splitPort(t, pprofAddr)
	type req struct{ method, addr, path, body string }
	reqs := []req{
		{"POST", api, "/lockd.v1.LockService/ListLocks", "{}"},
		{"POST", api, "/lockd.v1.LockService/ListSessions", "{}"},
		{"GET", api, "/ui/", ""},
		{"GET", api, "/v1/snapshot", ""},
		{"GET", api, "/v1/watch?prefix=", ""},
		{"GET", pprofAddr, "/debug/pprof/", ""},
		{"GET", pprofAddr, "/debug/pprof/cmdline", ""},
	}
	portOf := func(r req) string {
		if r.addr == pprofAddr {
			return pport
		}
		return port
	}
	for _, r := range reqs {
		host := "evil.example:" + portOf(r)
		code, body := guardRequest(t, "", r.method, r.addr, r.path, host, connectJSON, r.body)
		if code != http.StatusForbidden || !strings.Contains(body, host) || !strings.Contains(body, "--allowed-hosts") {
			t.Errorf("%s %s with Host %s: %d %q, want 403 naming the Host and --allowed-hosts", r.method, r.path, host, code, body)
		}
		for _, h := range []string{"localhost:", "127.0.0.1:", "[::1]:", "lockd.internal:", "LOCKD.internal.:"} {
			if code, body := guardRequest(t, "", r.method, r.addr, r.path, h+portOf(r), connectJSON, r.body); code != http.StatusOK {
				t.Errorf("%s %s with Host %s: %d %q, want 200", r.method, r.path, h+portOf(r), code, body)
			}
		}
	}
	hdr := map[string]string{"Origin": "http://evil.example"}
	for k, v := range connectJSON {
		hdr[k] = v
	}
	if code, body := guardRequest(t, "", "POST", api, "/lockd.v1.LockService/ListLocks", api, hdr, "{}"); code != http.StatusForbidden {
		t.Errorf("a foreign Origin: %d %q, want 403", code, body)
	}
	if got := scrapeMetric(t, "http://"+api, `lockd_host_refused_total{header="host"}`); got != float64(len(reqs)) {
		t.Errorf(`lockd_host_refused_total{header="host"} = %v, want %d`, got, len(reqs))
	}
}

func splitPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return h, p
}

// TestServeQuickStartBrowser: the quick start, unchanged (no flag but the
// ports and data dir), as a browser on the same machine uses it at
// http://127.0.0.1:PORT/ui/ and http://localhost:PORT/ui/: the page, its
// files, and its own fetches (Connect JSON calls with the page's Origin,
// /metrics, the member health, the SSE watch); and the CLI against every
// documented address form.
func TestServeQuickStartBrowser(t *testing.T) {
	api := freePort(t)
	startNode(t, filepath.Join(t.TempDir(), "data"), api, freePort(t), "/readyz")
	_, port := splitPort(t, api)
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port} {
		origin := "http://" + host
		nav := map[string]string{"Accept": "text/html", "Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "User-Agent": "Mozilla/5.0"}
		code, page := guardRequest(t, "", "GET", api, "/ui/", host, nav, "")
		if code != http.StatusOK || !strings.Contains(page, "app.js") {
			t.Fatalf("GET %s/ui/: %d %q", origin, code, page)
		}
		sameOrigin := map[string]string{"Origin": origin, "Referer": origin + "/ui/", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
		with := func(extra map[string]string) map[string]string {
			m := map[string]string{}
			for k, v := range sameOrigin {
				m[k] = v
			}
			for k, v := range extra {
				m[k] = v
			}
			return m
		}
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/ui/app.js", ""},
			{"POST", "/lockd.v1.LockService/Status", "{}"},
			{"POST", "/lockd.v1.LockService/ListLocks", `{"prefix":"","pageSize":100}`},
			{"POST", "/lockd.v1.LockService/ListSessions", "{}"},
			{"GET", "/metrics", ""},
			{"GET", "/ui/api/health", ""},
			{"GET", "/v1/watch?prefix=&state=1", ""},
		} {
			h := with(connectJSON)
			if r.method == "GET" {
				h = with(map[string]string{"Accept": "*/*"})
			}
			if strings.HasPrefix(r.path, "/v1/watch") {
				h["Accept"] = "text/event-stream"
			}
			if code, body := guardRequest(t, "", r.method, api, r.path, host, h, r.body); code != http.StatusOK {
				t.Errorf("the dashboard at %s: %s %s: %d %q", origin, r.method, r.path, code, body)
			}
		}
	}
	for _, ep := range []string{api, "localhost:" + port, "http://" + api, "http://localhost:" + port} {
		for _, cmd := range [][]string{{"ls"}, {"status"}} {
			out, err := exec.Command(lockdBin, append(cmd, "--endpoints", ep, "--timeout", "5s")...).CombinedOutput()
			if err != nil {
				t.Errorf("lockd %s --endpoints %s: %v: %s", cmd[0], ep, err, out)
			}
		}
	}
}

// TestServeConnCapPerSource: 5 000 slow connections from 127.0.0.1 (half
// silent, half stopped in the middle of their header) leave a second
// source, 127.0.0.2, served promptly. The node's descriptors are limited
// to 4 096 (prlimit), as a node near its limit: without the cap the slow
// connections take them all, accept fails, and 127.0.0.2 waits until the
// 10 s header timeout frees some; with it the node holds 512 of them.
func TestServeConnCapPerSource(t *testing.T) {
	const slow, nodeFDs = 5000, 4096
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < slow+1000 {
		if lim.Max < slow+1000 {
			t.Skipf("RLIMIT_NOFILE hard limit %d: the test holds %d connections (raise it with ulimit -Hn)", lim.Max, slow)
		}
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	api := freePort(t)
	s := startNode(t, filepath.Join(t.TempDir(), "data"), api, freePort(t), "/readyz")
	// Go raised the node's soft limit to its hard one at start: lower both.
	if err := unix.Prlimit(s.cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: nodeFDs, Max: nodeFDs}, nil); err != nil {
		t.Skipf("cannot limit the node's descriptors: %v", err)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	reset := 0
	for i := range slow {
		c, err := d.Dial("tcp", api)
		if err != nil {
			if errors.Is(err, syscall.ECONNRESET) {
				reset++ // refused by the cap before the dial returned
				continue
			}
			t.Fatalf("slow connection %d: %v", i, err)
		}
		if i%2 == 1 {
			fmt.Fprintf(c, "POST /lockd.v1.LockService/ListLocks HTTP/1.1\r\nHost: %s\r\n", api)
		}
		held = append(held, c)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+api+"/lockd.v1.LockService/ListLocks", strings.NewReader("{}"))
	for k, v := range connectJSON {
		req.Header.Set(k, v)
	}
	two := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	hc := &http.Client{Transport: &http.Transport{DialContext: two.DialContext, DisableKeepAlives: true}}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("a Connect call from 127.0.0.2 with %d slow connections from 127.0.0.1 open: %v (after %v)", len(held), err, time.Since(start))
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a Connect call from 127.0.0.2: %d %q", resp.StatusCode, b)
	}
	t.Logf("127.0.0.2 served in %v with %d slow connections held (%d reset at dial)", time.Since(start), len(held), reset)
	code, metrics := guardRequest(t, "127.0.0.2", "GET", api, "/metrics", api, nil, "")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	var hits float64
	for line := range strings.Lines(metrics) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), `lockd_limit_hits_total{reason="conns"} `); ok {
			fmt.Sscan(v, &hits)
		}
	}
	// Slow connections past the header timeout free their slots, so a
	// slow dialling loop sees fewer refusals: a generous bound.
	if hits < slow-4*512 {
		t.Errorf(`lockd_limit_hits_total{reason="conns"} = %v, want about %d`, hits, slow-512)
	}
}

// TestClusterConnCapSparesPeers: with a tiny --max-conns-per-source, a
// follower that forwards 200 concurrent calls to the leader (one HTTP/1.1
// connection per call in flight) is not capped, because its address is a
// member's; a client from another address (127.0.0.2) is. Joins and the
// cluster's own traffic run under the same cap.
func TestClusterConnCapSparesPeers(t *testing.T) {
	const capConns = 4
	c := startCluster(t, 3, "--max-conns-per-source", fmt.Sprint(capConns))
	leader := c.waitStable(t, c.nodes, 30*time.Second)
	var follower, lead *clusterNode
	for _, n := range c.nodes {
		if n.id == leader {
			lead = n
		} else if follower == nil {
			follower = n
		}
	}
	// The client speaks HTTP/2 (one connection) from 127.0.0.2, so only
	// the follower's forwarding opens many connections.
	two := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	tr := &http.Transport{DialContext: two.DialContext, Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	client := lockdv1connect.NewLockServiceClient(&http.Client{Transport: tr}, follower.url())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// One call first: concurrent first calls could each dial.
	if _, err := client.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(30 * time.Second)})); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 200)
	for range cap(errs) {
		go func() {
			_, err := client.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(30 * time.Second)}))
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatalf("a call forwarded by %s to the leader %s: %v", follower.id, lead.id, err)
		}
	}
	if got := scrapeMetric(t, lead.url(), `lockd_api_forwarded_total`) + scrapeMetric(t, follower.url(), `lockd_api_forwarded_total`); got < float64(cap(errs)) {
		t.Errorf("forwarded %v calls, want %d", got, cap(errs))
	}
	if got := scrapeMetric(t, lead.url(), `lockd_limit_hits_total{reason="conns"}`); got != 0 {
		t.Errorf("the leader refused %v connections of its peers", got)
	}
	// A client's address is capped all the same.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range capConns + 3 {
		if c, err := two.Dial("tcp", lead.api); err == nil {
			held = append(held, c)
		}
	}
	if !pollEvery(10*time.Second, 20*time.Millisecond, func() bool {
		return scrapeMetric(t, lead.url(), `lockd_limit_hits_total{reason="conns"}`) == 3
	}) {
		t.Errorf(`lockd_limit_hits_total{reason="conns"} = %v after %d connections from 127.0.0.2, want 3`, scrapeMetric(t, lead.url(), `lockd_limit_hits_total{reason="conns"}`), capConns+3)
	}
}
