package server

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/auth"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// TestForwardKeepsIdentity: with auth on, a call made to a follower is
// forwarded to the leader with the caller's identity (the follower
// presents its peer token): the session belongs to the caller and its
// grants decide.
func TestForwardKeepsIdentity(t *testing.T) {
	dir := t.TempDir()
	authFile, peerFile := writePeerAuth(t, dir, "token "+auth.HashToken("billing-token")+" billing-app\ngrant billing-app lock billing/\n")
	auditPath := filepath.Join(dir, "audit.log")
	opts := defaultClusterOpts()
	opts.security = Security{AuthFile: authFile, PeerTokenFile: peerFile, AuditLog: auditPath}
	c := newTestCluster(t, 3, opts)
	leader, err := c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	follower := c.nodes[(leader+1)%3].url
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cl := c.newClient("billing", lockd.WithEndpoints(follower), lockd.WithToken("billing-token"))
	s, err := cl.NewSession(ctx, lockd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("session via a follower: %v", err)
	}
	m := s.NewMutex("billing/x")
	if err := m.Lock(ctx); err != nil {
		t.Fatalf("lock billing/x via a follower: %v", err)
	}
	if err := s.NewMutex("payments/x").TryLock(ctx); !errors.Is(err, lockd.ErrPermissionDenied) {
		t.Fatalf("TryLock payments/x via a follower: %v, want ErrPermissionDenied", err)
	}
	admin := lockdv1connect.NewLockServiceClient(http.DefaultClient, c.nodes[leader].url, connect.WithInterceptors(connect.UnaryInterceptorFunc(
		func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer admin-token")
				return next(ctx, req)
			}
		})))
	ls, err := admin.ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(ls.Msg.Sessions) != 1 || ls.Msg.Sessions[0].Identity != "billing-app" {
		t.Fatalf("sessions %v, want one of billing-app", ls.Msg.Sessions)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var fwd dto.Metric
	if err := c.server((leader + 1) % 3).api.Hooks().Forwarded().Write(&fwd); err != nil || fwd.GetCounter().GetValue() == 0 {
		t.Fatal("the follower forwarded nothing: the calls did not take the forwarding path")
	}
	// The follower refused payments/x itself (same auth file); the leader
	// decided the forwarded calls with the caller's identity.
	b, _ := os.ReadFile(auditPath)
	if !strings.Contains(string(b), `"identity":"billing-app","peer"`) {
		t.Fatalf("no audit line for billing-app:\n%s", b)
	}
}

// TestRateLimitPerIPWithoutAuth: with authentication off, --rate-limit
// applies per client IP address; KeepAlive is never limited.
func TestRateLimitPerIPWithoutAuth(t *testing.T) {
	opts := defaultClusterOpts()
	opts.security = Security{RateLimit: 0.001, RateBurst: 2}
	c := newTestCluster(t, 1, opts)
	ctx := t.Context()
	svc := lockdv1connect.NewLockServiceClient(http.DefaultClient, c.nodes[0].url)
	s, err := svc.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "x"})); err != nil {
		t.Fatal(err)
	}
	_, err = svc.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "x"}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "ip:127.0.0.1") {
		t.Fatalf("third call: %v, want resource exhausted for ip:127.0.0.1", err)
	}
	if _, err := svc.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: s.Msg.SessionId, Secret: s.Msg.Secret})); err != nil {
		t.Fatalf("keepalive over the rate: %v", err)
	}
}

// writePeerAuth writes to dir an auth file with extra lines, an admin
// (admin-token, identity ops) and a peer (peer-token, identity node), and
// the nodes' peer token file; it returns both paths.
func writePeerAuth(t *testing.T, dir, extra string) (authFile, peerFile string) {
	t.Helper()
	authFile = filepath.Join(dir, "auth")
	lines := extra + "token " + auth.HashToken("admin-token") + " ops\ngrant ops admin\n" +
		"token " + auth.HashToken("peer-token") + " node\ngrant node peer\n"
	if err := os.WriteFile(authFile, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	peerFile = filepath.Join(dir, "peer")
	if err := os.WriteFile(peerFile, []byte("peer-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return authFile, peerFile
}
