package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/auth"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// openWatch opens a Connect watch of prefix presenting token and reads its
// first keepalive (the stream is open), or returns why it was refused. It
// is closed when ctx ends.
func openWatch(ctx context.Context, url, token, prefix string) (*connect.ServerStreamForClient[lockdv1.WatchResponse], error) {
	w, err := lockdv1connect.NewWatchServiceClient(h2cClient(), url, connect.WithInterceptors(bearerTok(token))).
		Watch(ctx, connect.NewRequest(&lockdv1.WatchRequest{Prefix: prefix}))
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = w.Close() })
	if !w.Receive() {
		return nil, w.Err()
	}
	return w, nil
}

// sseStatus opens GET /v1/watch and returns its status code (the body is
// closed when ctx ends).
func sseStatus(t *testing.T, ctx context.Context, url, token string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/v1/watch?prefix=", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	context.AfterFunc(ctx, func() { resp.Body.Close() })
	return resp.StatusCode
}

// waitStreamsFreed waits until the node counts no open stream: each slot
// is freed when its stream ends on the server, a moment after the client
// hung up.
func waitStreamsFreed(t *testing.T, s *Server) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		n := len(s.guard.StreamsOpen())
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream slots still taken after every stream ended: %v", s.guard.StreamsOpen())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamCapPerIP: without authentication, the streams of one client IP
// address on a node are capped: a session stream, a Connect watch or an
// SSE watch over the cap is refused (RESOURCE_EXHAUSTED, 429) and counted
// in lockd_limit_hits_total{reason="streams"}; every slot is freed when its
// stream ends, round after round (no leak).
func TestStreamCapPerIP(t *testing.T) {
	opts := defaultClusterOpts()
	opts.security = Security{MaxStreamsPerIdentity: 3}
	c := newTestCluster(t, 1, opts)
	srv, url := c.server(0), c.nodes[0].url
	for round := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		if _, err := openSessionStream(t, ctx, url, ""); err != nil {
			t.Fatalf("round %d: session stream: %v", round, err)
		}
		if _, err := openWatch(ctx, url, "", "a/"); err != nil {
			t.Fatalf("round %d: watch: %v", round, err)
		}
		if code := sseStatus(t, ctx, url, ""); code != http.StatusOK {
			t.Fatalf("round %d: SSE watch: %d", round, code)
		}
		if _, err := openSessionStream(t, ctx, url, ""); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Errorf("round %d: session stream over the cap: %v, want resource exhausted", round, err)
		}
		if _, err := openWatch(ctx, url, "", "b/"); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Errorf("round %d: watch over the cap: %v, want resource exhausted", round, err)
		}
		if code := sseStatus(t, ctx, url, ""); code != http.StatusTooManyRequests {
			t.Errorf("round %d: SSE watch over the cap: %d, want 429", round, code)
		}
		cancel()
		waitStreamsFreed(t, srv)
	}
	if got := testutil.ToFloat64(srv.api.LimitHits().WithLabelValues("streams")); got != 9 {
		t.Errorf("lockd_limit_hits_total{reason=streams} = %v, want 9", got)
	}
}

// TestStreamCapPerIdentity: with authentication, the cap is per identity
// (limit ID streams=N, else the server default); another identity is not
// affected, a caller without credentials cannot open a session stream at
// all, and the Go client over the cap falls back to unary calls.
func TestStreamCapPerIdentity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	lines := "token " + auth.HashToken("billing-token") + " billing-app\ngrant billing-app lock billing/\nlimit billing-app streams=1\n" +
		"token " + auth.HashToken("admin-token") + " ops\ngrant ops admin\n"
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := defaultClusterOpts()
	opts.security = Security{AuthFile: path, MaxStreamsPerIdentity: 2}
	c := newTestCluster(t, 1, opts)
	srv, url := c.server(0), c.nodes[0].url
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := openSessionStream(t, ctx, url, "billing-token"); err != nil {
		t.Fatal(err)
	}
	if _, err := openWatch(ctx, url, "billing-token", "billing/"); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("billing-app's second stream: %v, want resource exhausted", err)
	}
	for i := range 2 {
		if _, err := openWatch(ctx, url, "admin-token", ""); err != nil {
			t.Fatalf("ops stream %d: %v", i, err)
		}
	}
	if _, err := openSessionStream(t, ctx, url, "admin-token"); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("ops' third stream (default cap 2): %v, want resource exhausted", err)
	}
	if _, err := openSessionStream(t, ctx, url, ""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("session stream without credentials: %v, want unauthenticated", err)
	}
	cl := c.newClient("billing", lockd.WithToken("billing-token"))
	s, err := cl.NewSession(ctx, lockd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("Go client at its identity's stream cap: %v", err)
	}
	if err := s.NewMutex("billing/x").Lock(ctx); err != nil {
		t.Fatalf("Go client at its identity's stream cap locks: %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cl.Close(ctx)
	cancel()
	waitStreamsFreed(t, srv)
}

// TestStreamCapForgedForwardHeader: a watch that says it was forwarded
// (a header any client can send without auth) still takes a stream slot:
// watches are never forwarded. Before the fix five such watches opened
// from one address under a cap of one.
func TestStreamCapForgedForwardHeader(t *testing.T) {
	opts := defaultClusterOpts()
	opts.security = Security{MaxStreamsPerIdentity: 1}
	c := newTestCluster(t, 1, opts)
	url := c.nodes[0].url
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := openWatch(ctx, url, "", "a/"); err != nil {
		t.Fatal(err)
	}
	req := connect.NewRequest(&lockdv1.WatchRequest{Prefix: "b/"})
	req.Header().Set(ForwardedHeader, "n9")
	w, err := lockdv1connect.NewWatchServiceClient(h2cClient(), url).Watch(ctx, req)
	if err == nil {
		context.AfterFunc(ctx, func() { _ = w.Close() })
		if !w.Receive() {
			err = w.Err()
		}
	}
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a watch with a forged %s header over the cap: %v, want resource exhausted", ForwardedHeader, err)
	}
}
