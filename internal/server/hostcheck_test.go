package server

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockd-dev/lockd/internal/certs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// startHostNode starts a one-node cluster on real 127.0.0.1 sockets (API
// and Raft) with cfg changed by edit, and waits until it leads.
func startHostNode(t *testing.T, edit func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Listen, cfg.RaftListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = 50*time.Millisecond, 50*time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(cfg, WithLogger(testLogger("h1")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// hostRequest sends one request to s with the given Host (and Origin,
// when not "") and returns its status and body. A streaming answer (the
// SSE watch) is cut after its status.
func hostRequest(t *testing.T, s *Server, method, path, host, origin string, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+s.Addr().String()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Connect-Protocol-Version", "1")
	}
	if strings.HasPrefix(path, "/v1/watch") {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := http.DefaultClient.Do(req)
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

// hostPaths are the kinds of requests the API port serves: a Connect
// call, the dashboard, the backup download and the SSE watch.
var hostPaths = []struct{ method, path, body string }{
	{http.MethodPost, "/lockd.v1.LockService/ListLocks", "{}"},
	{http.MethodGet, "/ui/", ""},
	{http.MethodGet, "/v1/snapshot", ""},
	{http.MethodGet, "/v1/watch?prefix=", ""},
}

// TestHostCheckRefusesForeignHost: the DNS rebinding guard. A request
// whose Host names a foreign host (a rebound page's) is refused with 403
// and a line naming the Host and --allowed-hosts, on every kind of
// request; loopback names and IP literals are served; an Origin naming a
// foreign host (or "null") is refused while the dashboard's own (same
// origin) is served; refusals are counted. On a node without the check
// every foreign request is served (200), so this fails there.
func TestHostCheckRefusesForeignHost(t *testing.T) {
	s := startHostNode(t, nil)
	_, port, _ := net.SplitHostPort(s.Addr().String())
	refused := 0
	for _, p := range hostPaths {
		for _, host := range []string{"evil.example:" + port, "evil.example", "EVIL.example.:" + port, "127.0.0.1.evil.example:" + port} {
			code, body := hostRequest(t, s, p.method, p.path, host, "", p.body)
			refused++
			if code != http.StatusForbidden || !strings.Contains(body, "--allowed-hosts") || !strings.Contains(body, host) {
				t.Errorf("%s %s with Host %s: %d %q, want 403 naming the Host and --allowed-hosts", p.method, p.path, host, code, body)
			}
		}
		for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "LocalHost.:" + port, "app.localhost:" + port, "10.1.2.3", "[fe80::1]:" + port} {
			if code, body := hostRequest(t, s, p.method, p.path, host, "", p.body); code != http.StatusOK {
				t.Errorf("%s %s with Host %s: %d %q, want 200", p.method, p.path, host, code, body)
			}
		}
	}
	const list = "/lockd.v1.LockService/ListLocks"
	self := "127.0.0.1:" + port
	for _, origin := range []string{"http://evil.example", "http://evil.example:" + port, "null", "http://localhost.evil.example"} {
		refused++
		if code, body := hostRequest(t, s, http.MethodPost, list, self, origin, "{}"); code != http.StatusForbidden || !strings.Contains(body, "Origin") {
			t.Errorf("Origin %s: %d %q, want 403", origin, code, body)
		}
	}
	for _, o := range []struct{ host, origin string }{
		{self, "http://" + self}, {"localhost:" + port, "http://localhost:" + port}, {self, "http://[::1]:" + port},
	} {
		if code, body := hostRequest(t, s, http.MethodPost, list, o.host, o.origin, "{}"); code != http.StatusOK {
			t.Errorf("Host %s, Origin %s: %d %q, want 200", o.host, o.origin, code, body)
		}
	}
	got := testutil.ToFloat64(s.guard.HostRefusals().WithLabelValues("host")) + testutil.ToFloat64(s.guard.HostRefusals().WithLabelValues("origin"))
	if got != float64(refused) {
		t.Errorf("lockd_host_refused_total = %v, want %d", got, refused)
	}
}

// hostTransport sends every request with Host (HTTP/2: :authority) host,
// as a client that dialled that name would.
type hostTransport struct {
	host string
	base http.RoundTripper
}

func (h hostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	return h.base.RoundTrip(r)
}

// TestHostCheckGRPCAuthority: a gRPC call (HTTP/2) is checked by its
// :authority like an HTTP/1.1 call by its Host.
func TestHostCheckGRPCAuthority(t *testing.T) {
	s := startHostNode(t, nil)
	_, port, _ := net.SplitHostPort(s.Addr().String())
	call := func(host string) error {
		hc := h2cClient()
		hc.Transport = hostTransport{host: host, base: hc.Transport}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := lockdv1connect.NewLockServiceClient(hc, "http://"+s.Addr().String(), connect.WithGRPC()).
			ListLocks(ctx, connect.NewRequest(&lockdv1.ListLocksRequest{}))
		return err
	}
	if err := call("evil.example:" + port); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("gRPC with :authority evil.example: %v, want permission denied", err)
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port} {
		if err := call(host); err != nil {
			t.Errorf("gRPC with :authority %s: %v", host, err)
		}
	}
}

// TestHostCheckAllowedHosts: --allowed-hosts admits its names (any case,
// any port, a trailing dot; *.domain one label under it) and the node's
// --advertise host is its own; "*" turns the check off.
func TestHostCheckAllowedHosts(t *testing.T) {
	s := startHostNode(t, func(c *Config) {
		c.AllowedHosts = []string{"lockd.internal", "*.corp.example"}
		c.Advertise = "http://node1.example:7070"
	})
	const list = "/lockd.v1.LockService/ListLocks"
	for host, want := range map[string]int{
		"lockd.internal:7070": 200, "LOCKD.Internal.": 200, "lockd.internal:1": 200,
		"a.corp.example": 200, "node1.example:9": 200,
		"a.b.corp.example": 403, "corp.example": 403, "lockd.internal.evil.example": 403, "evil.example": 403,
	} {
		if code, body := hostRequest(t, s, http.MethodPost, list, host, "", "{}"); code != want {
			t.Errorf("Host %s: %d %q, want %d", host, code, body, want)
		}
	}
	if code, _ := hostRequest(t, s, http.MethodPost, list, "lockd.internal", "https://lockd.internal", "{}"); code != 200 {
		t.Errorf("Origin https://lockd.internal: %d, want 200", code)
	}

	open := startHostNode(t, func(c *Config) { c.AllowedHosts = []string{"*"} })
	if code, body := hostRequest(t, open, http.MethodPost, list, "evil.example", "http://evil.example", "{}"); code != 200 {
		t.Errorf("--allowed-hosts '*': %d %q, want 200", code, body)
	}
}

// TestAllowedHostsValidate: a URL or an embedded wildcard in
// --allowed-hosts is a configuration error, not a silent no-match.
func TestAllowedHostsValidate(t *testing.T) {
	// "*." and "*.." are what a template's "*.${DOMAIN}" gives with DOMAIN
	// unset: they normalize to "*" (no check at all) or to no domain.
	for _, bad := range []string{"http://lockd.internal", "lockd.internal/x", "a.*.example", "", "a b", "*.", "*..", "."} {
		cfg := DefaultConfig()
		cfg.AllowedHosts = []string{bad}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "allowed-hosts") {
			t.Errorf("allowed-hosts %q: %v, want an error", bad, err)
		}
	}
	cfg := DefaultConfig()
	cfg.AllowedHosts = []string{"lockd.internal", "*.corp.example", "*", "10.0.0.1"}
	if err := cfg.Validate(); err != nil {
		t.Error(err)
	}
}

// TestHostCheckAudited: refusals by the Host check are audited like limit
// refusals: the first of a client address gets a line at once, the next
// ones within the window are counted into one line, so a flood of foreign
// Hosts cannot flood the audit log.
func TestHostCheckAudited(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	s := startHostNode(t, func(c *Config) { c.AuditLog = path })
	const n = 50
	for range n {
		if code, _ := hostRequest(t, s, http.MethodGet, "/ui/", "evil.example", "", ""); code != http.StatusForbidden {
			t.Fatalf("foreign Host: %d, want 403", code)
		}
	}
	s.Close() // flushes the open windows
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines, total := 0, 0
	for line := range strings.Lines(string(b)) {
		var e AuditEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if e.Op != "HostCheck" || e.Outcome != "refused" || e.Code != "permission_denied" || !strings.Contains(e.Reason, "evil.example") || !strings.HasPrefix(e.Peer, "127.0.0.1:") {
			t.Errorf("audit line %q: want a HostCheck refusal of evil.example from 127.0.0.1", line)
		}
		lines++
		total += max(e.Count, 1)
	}
	if total != n || lines > n/5 {
		t.Errorf("%d audit lines standing for %d refusals, want %d refusals in a few lines", lines, total, n)
	}
}

// TestHostCheckTLSNames: with TLS, the DNS names of the node's current
// certificate are its own (a wildcard name one label deep); a certificate
// swapped on disk brings its names and takes the old ones away.
func TestHostCheckTLSNames(t *testing.T) {
	p := newTestPKI(t)
	cfg := p.nodeConfig(t, "h1")
	write := func(hosts ...string) {
		pair, err := certs.Issue(p.ca, certs.Node, "h1", append([]string{"127.0.0.1"}, hosts...), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		for f, b := range map[string][]byte{cfg.TLSCert: pair.Cert, cfg.TLSKey: pair.Key} {
			if err := os.WriteFile(f+".tmp", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(f+".tmp", f); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("node1.lockd.test", "*.pool.lockd.test")
	s := startTLS(t, cfg)
	waitLeaderOf(t, s)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: p.tlsConfigFor(t, "", ""), DisableKeepAlives: true}}
	status := func(host string) int {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://"+s.Addr().String()+"/ui/", nil)
		req.Host = host // the TLS server name stays 127.0.0.1
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for host, want := range map[string]int{"node1.lockd.test": 200, "Node1.Lockd.Test.:7070": 200, "a.pool.lockd.test": 200, "a.b.pool.lockd.test": 403, "node2.lockd.test": 403} {
		if got := status(host); got != want {
			t.Errorf("Host %s: %d, want %d", host, got, want)
		}
	}
	write("node2.lockd.test")
	for deadline := time.Now().Add(10 * time.Second); status("node2.lockd.test") != 200; {
		if time.Now().After(deadline) {
			t.Fatal("the names of a certificate swapped on disk are not allowed")
		}
		time.Sleep(20 * time.Millisecond) // the file's stamp must change: polled
	}
	if got := status("node1.lockd.test"); got != 403 {
		t.Errorf("a name of the old certificate: %d, want 403", got)
	}
}
