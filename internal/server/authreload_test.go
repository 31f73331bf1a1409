package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/auth"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// bearerTok sets a bearerTok token on unary and streaming calls ("" none).
type bearerTok string

func (b bearerTok) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if b != "" {
			req.Header().Set("Authorization", "Bearer "+string(b))
		}
		return next(ctx, req)
	}
}

func (b bearerTok) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if b != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		}
		return conn
	}
}

func (b bearerTok) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// h2cClient speaks HTTP/2 cleartext only (the session stream needs it).
func h2cClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// replaceFile writes b to path the way an operator should: a new file
// renamed over the old one, so no reader sees half of it.
func replaceFile(t *testing.T, path string, b string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// openSessionStream opens a session stream presenting token and reads its
// open frame. The stream is closed when ctx ends (a cancelled context
// alone leaves the request body open: the server would not see the end).
func openSessionStream(t *testing.T, ctx context.Context, url, token string) (*connect.BidiStreamForClient[lockdv1.StreamRequest, lockdv1.StreamResponse], error) {
	t.Helper()
	st := lockdv1connect.NewSessionServiceClient(h2cClient(), url, connect.WithInterceptors(bearerTok(token))).Stream(ctx)
	context.AfterFunc(ctx, func() {
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	})
	if err := st.Send(nil); err != nil {
		return nil, err
	}
	if _, err := st.Receive(); err != nil {
		return nil, err
	}
	return st, nil
}

// streamEnd reads st until it ends and returns why.
func streamEnd[T any](st interface{ Receive() (*T, error) }) error {
	for {
		if _, err := st.Receive(); err != nil {
			return err
		}
	}
}

// TestAuthReload: a reload (SIGHUP) of the auth file applies to new
// calls and to open streams: a removed token is refused and its session
// stream ends with PERMISSION_DENIED; a narrowed grant applies to new
// calls and ends a watch it no longer covers; a file that does not parse
// keeps the rules in force. Each reload is counted.
func TestAuthReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth")
	head := "token " + auth.HashToken("admin-token") + " ops\ngrant ops admin\n"
	billing := "token " + auth.HashToken("billing-token") + " billing-app\ngrant billing-app lock billing/\n"
	v1 := head + billing + "token " + auth.HashToken("reader-token") + " dashboard\ngrant dashboard read\n"
	v2 := head + "token " + auth.HashToken("reader-token") + " dashboard\ngrant dashboard read billing/\n"
	replaceFile(t, path, v1)
	auditPath := filepath.Join(dir, "audit.log")
	opts := defaultClusterOpts()
	opts.security = Security{AuthFile: path, AuditLog: auditPath}
	c := newTestCluster(t, 1, opts)
	srv, url := c.server(0), c.nodes[0].url
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	lock := func(token string) lockdv1connect.LockServiceClient {
		return lockdv1connect.NewLockServiceClient(http.DefaultClient, url, connect.WithInterceptors(bearerTok(token)))
	}
	describe := func(token, name string) error {
		_, err := lock(token).DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
		return err
	}

	// Before: billing-app locks, dashboard reads everything.
	sess, err := lock("billing-token").CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	st, err := openSessionStream(t, ctx, url, "billing-token")
	if err != nil {
		t.Fatalf("billing opens a session stream: %v", err)
	}
	if err := describe("reader-token", "payments/x"); err != nil {
		t.Fatalf("dashboard describes payments/x: %v", err)
	}
	watch := func(prefix string) *connect.ServerStreamForClient[lockdv1.WatchResponse] {
		w, err := lockdv1connect.NewWatchServiceClient(h2cClient(), url, connect.WithInterceptors(bearerTok("reader-token"))).
			Watch(ctx, connect.NewRequest(&lockdv1.WatchRequest{Prefix: prefix}))
		if err != nil {
			t.Fatal(err)
		}
		if !w.Receive() { // the first keepalive: the stream is open
			t.Fatalf("watch %s: %v", prefix, w.Err())
		}
		return w
	}
	wPayments, wBilling := watch("payments/"), watch("billing/")

	// Reload: billing-app's token is gone, dashboard reads billing/ only.
	replaceFile(t, path, v2)
	if err := srv.ReloadAuth(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	wantCode := func(what string, err error, code connect.Code) {
		t.Helper()
		if connect.CodeOf(err) != code {
			t.Errorf("%s: %v, want %v", what, err, code)
		}
	}
	wantCode("removed token describes billing/x", describe("billing-token", "billing/x"), connect.CodeUnauthenticated)
	_, err = lock("billing-token").KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: sess.Msg.SessionId, Secret: sess.Msg.Secret}))
	wantCode("removed token keeps its session alive", err, connect.CodeUnauthenticated)
	wantCode("the open session stream of the removed token", streamEnd[lockdv1.StreamResponse](st), connect.CodePermissionDenied)
	wantCode("narrowed grant describes payments/x", describe("reader-token", "payments/x"), connect.CodePermissionDenied)
	if err := describe("reader-token", "billing/x"); err != nil {
		t.Errorf("narrowed grant describes billing/x: %v", err)
	}
	for wPayments.Receive() {
	}
	wantCode("the open watch of payments/ after the grant narrowed", wPayments.Err(), connect.CodePermissionDenied)
	// The watch the new grant still covers goes on: it sees a new event.
	if _, err := lock("admin-token").CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{})); err != nil {
		t.Fatal(err)
	}
	s2, err := lock("admin-token").CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock("admin-token").Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: s2.Msg.SessionId, Secret: s2.Msg.Secret, Seq: 1, Name: "billing/y"})); err != nil {
		t.Fatal(err)
	}
	for wBilling.Receive() {
		if wBilling.Msg().GetName() == "billing/y" {
			break
		}
	}
	if wBilling.Err() != nil {
		t.Errorf("the watch of billing/ ended after the reload: %v", wBilling.Err())
	}
	wBilling.Close()

	// A broken file: the reload fails and the rules in force stay.
	replaceFile(t, path, v1+"grant dashboard write everything\n")
	if err := srv.ReloadAuth(); err == nil {
		t.Error("reload of a broken file: no error")
	}
	wantCode("removed token after a failed reload", describe("billing-token", "billing/x"), connect.CodeUnauthenticated)
	wantCode("narrowed grant after a failed reload", describe("reader-token", "payments/x"), connect.CodePermissionDenied)
	if err := describe("reader-token", "billing/x"); err != nil {
		t.Errorf("dashboard after a failed reload: %v", err)
	}
	if ok, bad := testutil.ToFloat64(srv.api.AuthReloads().WithLabelValues("ok")), testutil.ToFloat64(srv.api.AuthReloads().WithLabelValues("error")); ok != 1 || bad != 1 {
		t.Errorf("lockd_auth_reloads_total ok=%v error=%v, want 1 and 1", ok, bad)
	}
	b, _ := os.ReadFile(auditPath)
	if !strings.Contains(string(b), `"op":"Stream","outcome":"refused"`) || !strings.Contains(string(b), `"op":"Watch","lock":"payments/","outcome":"refused"`) {
		t.Errorf("no audit line for the streams ended by the reload:\n%s", b)
	}
}

// TestAuthReloadCancelsQueuedAcquire: when a reload ends a session stream,
// the stream's calls in flight end with it: a queued Acquire of the
// revoked caller is not answered QUEUED or GRANTED afterwards (before the
// fix it was, when its poll ended, and the stream stayed open meanwhile).
func TestAuthReloadCancelsQueuedAcquire(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth")
	head := "token " + auth.HashToken("admin-token") + " ops\ngrant ops admin\ngrant ops lock\n"
	billing := "token " + auth.HashToken("billing-token") + " billing-app\ngrant billing-app lock billing/\n"
	replaceFile(t, path, head+billing)
	opts := defaultClusterOpts()
	opts.security = Security{AuthFile: path}
	c := newTestCluster(t, 1, opts)
	srv, url := c.server(0), c.nodes[0].url
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	lock := func(token string) lockdv1connect.LockServiceClient {
		return lockdv1connect.NewLockServiceClient(http.DefaultClient, url, connect.WithInterceptors(bearerTok(token)))
	}
	holder, err := lock("billing-token").CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock("billing-token").Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{
		SessionId: holder.Msg.SessionId, Secret: holder.Msg.Secret, Seq: 1, Name: "billing/x"})); err != nil {
		t.Fatal(err)
	}
	waiter, err := lock("billing-token").CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	st, err := openSessionStream(t, ctx, url, "billing-token")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&lockdv1.StreamRequest{CallId: 1, Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{
		SessionId: waiter.Msg.SessionId, Secret: waiter.Msg.Secret, Seq: 1, Name: "billing/x",
		Wait: true, PollTimeout: durationpb.New(20 * time.Second)}}}); err != nil {
		t.Fatal(err)
	}
	for queued := false; !queued; { // the Acquire is in the queue
		d, err := lock("admin-token").DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "billing/x"}))
		if err != nil {
			t.Fatal(err)
		}
		queued = len(d.Msg.GetLock().GetWaiters()) == 1
		if !queued {
			select {
			case <-ctx.Done():
				t.Fatal("the streamed Acquire never queued")
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	replaceFile(t, path, head)
	if err := srv.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := st.Receive()
		if err != nil {
			if connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("stream ended with %v, want PERMISSION_DENIED", err)
			}
			break
		}
		if a := resp.GetAcquire(); a != nil {
			t.Errorf("the revoked caller's queued Acquire was answered %v after the reload", a)
		}
	}
}
