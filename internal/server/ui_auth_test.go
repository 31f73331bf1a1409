package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/certs"
)

// The dashboard under --auth-file (docs/dashboard.md, "Under
// authentication"): a browser sends no bearer token, so an operator gives
// it a client certificate whose name has a read grant, or puts a proxy in
// front that adds a read-only token. Every request the page makes (the
// page, Status, ListLocks, ListSessions, Explain of the selected lock,
// member health, /metrics, the watch stream) is answered both ways, and
// refused with neither.
func TestDashboardUnderAuth(t *testing.T) {
	leakCheck(t)
	p := newTestPKI(t)
	dashCrt, dashKey := p.issue(t, certs.Client, "dash")
	authFile := filepath.Join(t.TempDir(), "auth")
	lines := "grant dash read\n" + "token " + auth.HashToken("viewer-token") + " viewer\ngrant viewer read\n"
	if err := os.WriteFile(authFile, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := p.nodeConfig(t, "n1")
	cfg.TLSClientAuth = "verify-if-given"
	cfg.AuthFile = authFile
	s := startTLS(t, cfg)
	waitLeaderOf(t, s)

	type request struct {
		method, path, body string
		open               bool // answered without credentials too
	}
	page := []request{
		{method: "GET", path: "/ui/", open: true},
		{method: "GET", path: "/metrics", open: true},
		{method: "POST", path: "/lockd.v1.LockService/Status", body: "{}"},
		{method: "POST", path: "/lockd.v1.LockService/ListLocks", body: `{"prefix":"","pageSize":50}`},
		{method: "POST", path: "/lockd.v1.LockService/ListSessions", body: "{}"},
		{method: "POST", path: "/lockd.v1.LockService/Explain", body: `{"name":"jobs/a"}`},
		{method: "GET", path: "/ui/api/health"},
		{method: "GET", path: "/v1/watch?prefix="},
	}
	get := func(tc *tls.Config, token string, r request) (int, string) {
		t.Helper()
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		defer hc.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, r.method, s.URL()+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		if r.method == "POST" {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Connect-Protocol-Version", "1")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		defer resp.Body.Close()
		var head string
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			// The stream stays open: its first line is enough.
			head, _ = bufio.NewReader(resp.Body).ReadString('\n')
		} else {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			head = string(b)
		}
		return resp.StatusCode, head
	}
	for _, r := range page {
		if code, body := get(p.tlsConfigFor(t, dashCrt, dashKey), "", r); code != http.StatusOK {
			t.Errorf("%s %s with the dash certificate: %d %s", r.method, r.path, code, body)
		}
		if code, body := get(p.tlsConfigFor(t, "", ""), "viewer-token", r); code != http.StatusOK {
			t.Errorf("%s %s with the viewer token (a proxy's header): %d %s", r.method, r.path, code, body)
		}
		code, body := get(p.tlsConfigFor(t, "", ""), "", r)
		if r.open && code != http.StatusOK {
			t.Errorf("%s %s without credentials: %d %s, want it open", r.method, r.path, code, body)
		}
		if !r.open && code != http.StatusUnauthorized {
			t.Errorf("%s %s without credentials: %d %s, want 401", r.method, r.path, code, body)
		}
	}
}
