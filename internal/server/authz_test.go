package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/server"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Tokens of the test auth file.
const (
	billingToken = "billing-token-0123456789"
	readerToken  = "reader-token-0123456789"
	adminToken   = "admin-token-0123456789"
	peerToken    = "peer-token-0123456789"
)

// writeAuthFile writes an auth file with four identities: billing-app
// (lock billing/), dashboard (read everything), ops (admin) and node
// (peer), plus extra lines.
func writeAuthFile(t testing.TB, extra ...string) string {
	t.Helper()
	lines := []string{
		"# test auth file",
		"token " + auth.HashToken(billingToken) + " billing-app",
		"grant billing-app lock billing/",
		"token " + auth.HashToken(readerToken) + " dashboard",
		"grant dashboard read",
		"token " + auth.HashToken(adminToken) + " ops",
		"grant ops admin",
		"token " + auth.HashToken(peerToken) + " node",
		"grant node peer",
	}
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte(strings.Join(append(lines, extra...), "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tokenClient is a raw LockService client presenting token ("" none)
// and extra headers.
func tokenClient(url, token string, headers map[string]string) lockdv1connect.LockServiceClient {
	return lockdv1connect.NewLockServiceClient(http.DefaultClient, url, connect.WithInterceptors(headerInterceptor(token, headers)))
}

func headerInterceptor(token string, headers map[string]string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if token != "" {
				req.Header().Set("Authorization", "Bearer "+token)
			}
			for k, v := range headers {
				req.Header().Set(k, v)
			}
			return next(ctx, req)
		}
	}
}

// readAudit parses the audit log.
func readAudit(t testing.TB, path string) []server.AuditEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []server.AuditEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e server.AuditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

func hasAudit(entries []server.AuditEntry, identity, op, outcome, lock string) bool {
	for _, e := range entries {
		if e.Identity == identity && e.Op == op && e.Outcome == outcome && (lock == "" || e.Lock == lock) {
			return true
		}
	}
	return false
}

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

// TestAuthPermissions is acceptance 2: with auth on, no credentials are
// refused; a token for billing/ cannot acquire, release or describe
// payments/x; a read-only token cannot acquire; only admin can
// force-release, remove a member or save a snapshot; each admin action
// and each refusal is in the audit log.
func TestAuthPermissions(t *testing.T) {
	auditPath := filepath.Join(t.TempDir(), "audit.log")
	srv := lockdtest.New(t, lockdtest.WithAuthFile(writeAuthFile(t)), lockdtest.WithAuditLog(auditPath))
	ctx := t.Context()
	anon := tokenClient(srv.URL(), "", nil)
	stranger := tokenClient(srv.URL(), "not-a-token", nil)
	billing := tokenClient(srv.URL(), billingToken, nil)
	reader := tokenClient(srv.URL(), readerToken, nil)
	admin := tokenClient(srv.URL(), adminToken, nil)

	// No or unknown credentials: refused, whatever the call.
	for name, c := range map[string]lockdv1connect.LockServiceClient{"no token": anon, "unknown token": stranger} {
		_, err := c.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
		wantCode(t, name+" CreateSession", err, connect.CodeUnauthenticated)
		_, err = c.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "billing/x"}))
		wantCode(t, name+" DescribeLock", err, connect.CodeUnauthenticated)
		_, err = c.Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
		wantCode(t, name+" Status", err, connect.CodeUnauthenticated)
	}

	// billing-app: billing/ yes, payments/ no.
	s, err := billing.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	sid, sec := s.Msg.SessionId, s.Msg.Secret
	g, err := billing.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: sid, Secret: sec, Seq: 1, Name: "billing/x"}))
	if err != nil {
		t.Fatalf("billing acquires billing/x: %v", err)
	}
	_, err = billing.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: sid, Secret: sec, Seq: 2, Name: "payments/x"}))
	wantCode(t, "billing acquires payments/x", err, connect.CodePermissionDenied)
	_, err = billing.Release(ctx, connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: sid, Secret: sec, Seq: 3, Name: "payments/x", Token: g.Msg.Token}))
	wantCode(t, "billing releases payments/x", err, connect.CodePermissionDenied)
	_, err = billing.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "payments/x"}))
	wantCode(t, "billing describes payments/x", err, connect.CodePermissionDenied)
	_, err = billing.ListLocks(ctx, connect.NewRequest(&lockdv1.ListLocksRequest{}))
	wantCode(t, "billing lists every lock", err, connect.CodePermissionDenied)
	if _, err := billing.ListLocks(ctx, connect.NewRequest(&lockdv1.ListLocksRequest{Prefix: "billing/"})); err != nil {
		t.Errorf("billing lists billing/: %v", err)
	}
	if _, err := billing.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "billing/x"})); err != nil {
		t.Errorf("billing describes billing/x: %v", err)
	}

	// dashboard: reads, cannot lock.
	if _, err := reader.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "billing/x"})); err != nil {
		t.Errorf("reader describes: %v", err)
	}
	if _, err := reader.ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{})); err != nil {
		t.Errorf("reader lists sessions: %v", err)
	}
	_, err = reader.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
	wantCode(t, "reader creates a session", err, connect.CodePermissionDenied)
	_, err = reader.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: sid, Secret: sec, Seq: 4, Name: "billing/y"}))
	wantCode(t, "reader acquires", err, connect.CodePermissionDenied)

	// A session belongs to its identity: even admin, with its id and
	// secret, cannot use it.
	_, err = admin.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: sid, Secret: sec, Seq: 5, Name: "billing/z"}))
	wantCode(t, "admin uses billing's session", err, connect.CodePermissionDenied)

	// Admin operations: only admin.
	for name, c := range map[string]lockdv1connect.LockServiceClient{"billing-app": billing, "dashboard": reader} {
		_, err = c.ForceRelease(ctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "billing/x"}))
		wantCode(t, name+" force-releases", err, connect.CodePermissionDenied)
	}
	cl := func(token string) lockdv1connect.ClusterServiceClient {
		return lockdv1connect.NewClusterServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(headerInterceptor(token, nil)))
	}
	_, err = cl(billingToken).RemoveMember(ctx, connect.NewRequest(&lockdv1.RemoveMemberRequest{NodeId: "ghost"}))
	wantCode(t, "billing removes a member", err, connect.CodePermissionDenied)
	_, err = cl(readerToken).TransferLeadership(ctx, connect.NewRequest(&lockdv1.TransferLeadershipRequest{}))
	wantCode(t, "reader transfers leadership", err, connect.CodePermissionDenied)
	snap := func(token string) error {
		c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()), lockd.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		_, err = c.Snapshot(ctx, ioDiscard{})
		return err
	}
	if err := snap(readerToken); !errors.Is(err, lockd.ErrPermissionDenied) {
		t.Errorf("reader saves a snapshot: %v, want ErrPermissionDenied", err)
	}
	if err := snap(adminToken); err != nil {
		t.Errorf("admin saves a snapshot: %v", err)
	}
	fr, err := admin.ForceRelease(ctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "billing/x"}))
	if err != nil || len(fr.Msg.SessionIds) != 1 {
		t.Errorf("admin force-releases billing/x: %v %v", fr, err)
	}
	_, err = cl(adminToken).RemoveMember(ctx, connect.NewRequest(&lockdv1.RemoveMemberRequest{NodeId: "ghost"}))
	t.Logf("admin removes member ghost: %v", err)

	srv.Stop()
	log := readAudit(t, auditPath)
	for _, w := range []struct{ identity, op, outcome, lock string }{
		{"", "CreateSession", "refused", ""},
		{"", "DescribeLock", "refused", ""},
		{"", "Status", "refused", ""},
		{"billing-app", "Acquire", "refused", "payments/x"},
		{"billing-app", "Release", "refused", "payments/x"},
		{"billing-app", "DescribeLock", "refused", "payments/x"},
		{"billing-app", "ListLocks", "refused", ""},
		{"dashboard", "CreateSession", "refused", ""},
		{"dashboard", "Acquire", "refused", "billing/y"},
		{"ops", "Acquire", "refused", "billing/z"},
		{"billing-app", "ForceRelease", "refused", "billing/x"},
		{"dashboard", "ForceRelease", "refused", "billing/x"},
		{"billing-app", "RemoveMember", "refused", ""},
		{"dashboard", "TransferLeadership", "refused", ""},
		{"dashboard", "SnapshotSave", "refused", ""},
		{"ops", "SnapshotSave", "ok", ""},
		{"ops", "ForceRelease", "ok", "billing/x"},
	} {
		if !hasAudit(log, w.identity, w.op, w.outcome, w.lock) {
			t.Errorf("audit log has no %+v", w)
		}
	}
	found := false
	for _, e := range log {
		if e.Identity == "ops" && e.Op == "RemoveMember" && e.Member == "ghost" && e.Outcome != "refused" {
			found = true
		}
		if e.Time.IsZero() || e.Peer == "" || e.Node == "" {
			t.Errorf("audit entry without time, peer or node: %+v", e)
		}
	}
	if !found {
		t.Error("audit log has no RemoveMember ghost by ops")
	}
	b, _ := os.ReadFile(auditPath)
	for _, secret := range []string{sec, billingToken, readerToken, adminToken} {
		if strings.Contains(string(b), secret) {
			t.Errorf("audit log carries a secret or token %q", secret)
		}
	}
}

type ioDiscard struct{}

func (ioDiscard) Write(p []byte) (int, error) { return len(p), nil }

// TestForgedForwardedIdentity is acceptance 4: a forwarded-identity
// header from a client (not an authenticated peer) is ignored; from a
// peer it is believed.
func TestForgedForwardedIdentity(t *testing.T) {
	srv := lockdtest.New(t, lockdtest.WithAuthFile(writeAuthFile(t)))
	ctx := t.Context()
	forge := map[string]string{server.ForwardedIdentityHeader: "ops", server.ForwardedHeader: "n1"}
	for name, token := range map[string]string{"billing token": billingToken, "no token": "", "reader token": readerToken} {
		c := tokenClient(srv.URL(), token, forge)
		_, err := c.ForceRelease(ctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "billing/x"}))
		if code := connect.CodeOf(err); code != connect.CodePermissionDenied && code != connect.CodeUnauthenticated {
			t.Errorf("%s claiming to forward for ops: force release answered %v", name, err)
		}
	}
	// The same header from a peer is the original caller's identity.
	peer := tokenClient(srv.URL(), peerToken, forge)
	if _, err := peer.ForceRelease(ctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "billing/x"})); err != nil {
		t.Errorf("peer forwarding for ops: %v", err)
	}
	peerAsBilling := tokenClient(srv.URL(), peerToken, map[string]string{server.ForwardedIdentityHeader: "billing-app"})
	if _, err := peerAsBilling.ForceRelease(ctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "billing/x"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("peer forwarding for billing-app: force release answered %v, want permission denied", err)
	}
}

// TestGoClientToken: the Go client presents WithToken on unary calls and
// on the session stream, and maps refusals to sentinels.
func TestGoClientToken(t *testing.T) {
	srv := lockdtest.New(t, lockdtest.WithAuthFile(writeAuthFile(t)))
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			ctx := t.Context()
			c, err := lockd.New(lockd.WithEndpoints(srv.URL()), lockd.WithToken(billingToken), lockd.WithStream(stream))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			s, err := c.NewSession(ctx, lockd.WithTTL(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			m := s.NewMutex("billing/run")
			if err := m.Lock(ctx); err != nil {
				t.Fatalf("lock billing/run: %v", err)
			}
			if err := s.NewMutex("payments/run").TryLock(ctx); !errors.Is(err, lockd.ErrPermissionDenied) {
				t.Errorf("TryLock payments/run: %v, want ErrPermissionDenied", err)
			}
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	nobody, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer nobody.Close(context.Background())
	if _, err := nobody.NewSession(t.Context()); !errors.Is(err, lockd.ErrUnauthenticated) {
		t.Errorf("NewSession without a token: %v, want ErrUnauthenticated", err)
	}

	// Watch presents the token too, and ends (does not retry) on a refusal.
	watchFirst := func(c *lockd.Client, prefix string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		for ev, err := range c.Watch(ctx, prefix, lockd.WatchState()) {
			if err != nil || ev.Kind == lockd.EventSynced {
				return err
			}
		}
		return errors.New("watch ended without an event")
	}
	billing, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()), lockd.WithToken(billingToken))
	if err != nil {
		t.Fatal(err)
	}
	defer billing.Close(context.Background())
	if err := watchFirst(billing, "billing/"); err != nil {
		t.Errorf("billing watches billing/: %v", err)
	}
	if err := watchFirst(billing, "payments/"); !errors.Is(err, lockd.ErrPermissionDenied) {
		t.Errorf("billing watches payments/: %v, want ErrPermissionDenied", err)
	}
	if err := watchFirst(nobody, "billing/"); !errors.Is(err, lockd.ErrUnauthenticated) {
		t.Errorf("watch without a token: %v, want ErrUnauthenticated", err)
	}
}
