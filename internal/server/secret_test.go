package server_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// rawSecret is the session secret rawClient sessions are created with and
// present (secretInterceptor), so tests that are not about secrets read as
// before.
const rawSecret = "raw-client-secret-0123456789abcdef"

// secretInterceptor fills the secret field of every request that has one
// and leaves it empty.
func secretInterceptor(secret string) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if m, ok := req.Any().(proto.Message); ok {
				r := m.ProtoReflect()
				if fd := r.Descriptor().Fields().ByName("secret"); fd != nil && r.Get(fd).String() == "" {
					r.Set(fd, protoreflect.ValueOfString(secret))
				}
			}
			return next(ctx, req)
		}
	})
}

// bareClient is a LockService client that presents no secret of its own.
func bareClient(url string) lockdv1connect.LockServiceClient {
	return lockdv1connect.NewLockServiceClient(http.DefaultClient, url)
}

// TestSessionSecretRequired: without its session's secret, no call on
// another session's id is served (acceptance 1, auth off): Acquire,
// Release, KeepAlive, Cancel, Complete and CloseSession, unary and on the
// session stream.
func TestSessionSecretRequired(t *testing.T) {
	srv := lockdtest.New(t)
	c := newRaw(t, srv)
	victim := c.session(time.Minute)
	g, err := c.acquire(&lockdv1.AcquireRequest{SessionId: victim, Seq: 1, Name: "payments/x"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, secret := range []string{"", "wrong-secret-wrong-secret-0000"} {
		bad := bareClient(srv.URL())
		calls := map[string]func() error{
			"keepalive": func() error {
				_, err := bad.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: victim, Secret: secret}))
				return err
			},
			"release": func() error {
				_, err := bad.Release(ctx, connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: victim, Secret: secret, Seq: 10, Name: "payments/x", Token: g.Token}))
				return err
			},
			"cancel": func() error {
				_, err := bad.Cancel(ctx, connect.NewRequest(&lockdv1.CancelRequest{SessionId: victim, Secret: secret, Seq: 11, Name: "payments/x", AcquireSeq: 1}))
				return err
			},
			"complete": func() error {
				_, err := bad.Complete(ctx, connect.NewRequest(&lockdv1.CompleteRequest{SessionId: victim, Secret: secret, Seq: 12, Name: "payments/x", Token: g.Token, Retention: durationpb.New(time.Hour)}))
				return err
			},
			"acquire": func() error {
				_, err := bad.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: victim, Secret: secret, Seq: 13, Name: "other"}))
				return err
			},
			"close": func() error {
				_, err := bad.CloseSession(ctx, connect.NewRequest(&lockdv1.CloseSessionRequest{SessionId: victim, Secret: secret, Seq: 14}))
				return err
			},
		}
		for name, call := range calls {
			err := call()
			if connect.CodeOf(err) != connect.CodePermissionDenied || reason(err) != lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED {
				t.Errorf("%s with secret %q: %v, want permission denied", name, secret, err)
			}
		}
		// The same calls as frames on the session stream.
		st := lockdv1connect.NewSessionServiceClient(h2c(), srv.URL()).Stream(ctx)
		frames := []*lockdv1.StreamRequest{
			{CallId: 1, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: &lockdv1.KeepAliveBatch{Sessions: []*lockdv1.KeepAliveRequest{{SessionId: victim, Secret: secret}}}}},
			{CallId: 2, Body: &lockdv1.StreamRequest_Release{Release: &lockdv1.ReleaseRequest{SessionId: victim, Secret: secret, Seq: 20, Name: "payments/x", Token: g.Token}}},
			{CallId: 3, Body: &lockdv1.StreamRequest_Cancel{Cancel: &lockdv1.CancelRequest{SessionId: victim, Secret: secret, Seq: 21, Name: "payments/x", AcquireSeq: 1}}},
			{CallId: 4, Body: &lockdv1.StreamRequest_Complete{Complete: &lockdv1.CompleteRequest{SessionId: victim, Secret: secret, Seq: 22, Name: "payments/x", Token: g.Token, Retention: durationpb.New(time.Hour)}}},
			{CallId: 5, Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{SessionId: victim, Secret: secret, Seq: 23, Name: "other"}}},
			{CallId: 6, Body: &lockdv1.StreamRequest_CloseSession{CloseSession: &lockdv1.CloseSessionRequest{SessionId: victim, Secret: secret, Seq: 24}}},
		}
		for _, f := range frames {
			if err := st.Send(f); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < len(frames); {
			r, err := st.Receive()
			if err != nil {
				t.Fatal(err)
			}
			if r.CallId == 0 {
				continue
			}
			got++
			e := r.GetError()
			if ka := r.GetKeepAlive(); ka != nil {
				e = ka.Results[0].GetError()
			}
			if e.GetCode() != uint32(connect.CodePermissionDenied) || e.GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED {
				t.Errorf("stream call %d with secret %q: %v, want permission denied", r.CallId, secret, r)
			}
		}
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	}
	// The session is untouched: its holder still holds and renews.
	if _, err := c.svc.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: victim})); err != nil {
		t.Fatalf("owner's keepalive: %v", err)
	}
	chk, err := c.svc.CheckToken(ctx, connect.NewRequest(&lockdv1.CheckTokenRequest{Name: "payments/x", Token: g.Token}))
	if err != nil || !chk.Msg.Valid {
		t.Fatalf("hold after refused calls: %v %v", chk, err)
	}
}

// TestCreateSessionSecret: a server-made secret is returned and works; a
// retry with the same request id and secret gets the same session; the
// same request id with another secret is refused.
func TestCreateSessionSecret(t *testing.T) {
	srv := lockdtest.New(t)
	ctx := t.Context()
	bad := bareClient(srv.URL())
	r, err := bad.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Msg.Secret) < 32 {
		t.Fatalf("server-made secret %q is shorter than 128 bits of hex", r.Msg.Secret)
	}
	if _, err := bad.KeepAlive(ctx, connect.NewRequest(&lockdv1.KeepAliveRequest{SessionId: r.Msg.SessionId, Secret: r.Msg.Secret})); err != nil {
		t.Fatalf("keepalive with the server-made secret: %v", err)
	}
	req := &lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute), RequestId: "req-1", Secret: "client-secret-0123456789abcdef"}
	a, err := bad.CreateSession(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bad.CreateSession(ctx, connect.NewRequest(req))
	if err != nil || b.Msg.SessionId != a.Msg.SessionId {
		t.Fatalf("retry: %v %v, want session %s", b, err, a.Msg.SessionId)
	}
	req.Secret = "another-secret-0123456789abcdef"
	if _, err := bad.CreateSession(ctx, connect.NewRequest(req)); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("same request id, other secret: %v, want permission denied", err)
	}
	req.Secret = "short"
	req.RequestId = "req-2"
	if _, err := bad.CreateSession(ctx, connect.NewRequest(req)); reason(err) != lockdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT {
		t.Fatalf("short secret: %v, want invalid argument", err)
	}
}

// TestSecretNeverShown: describe, list, a busy answer, status and the
// server's logs carry session ids, never a secret.
func TestSecretNeverShown(t *testing.T) {
	var logs bytes.Buffer
	srv := lockdtest.New(t, lockdtest.WithLogger(slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	c := newRaw(t, srv)
	ctx := t.Context()
	holder := c.session(time.Minute)
	if _, err := c.acquire(&lockdv1.AcquireRequest{SessionId: holder, Seq: 1, Name: "job"}); err != nil {
		t.Fatal(err)
	}
	other := c.session(time.Minute)
	var seen []string
	add := func(m proto.Message) { b, _ := protojson.Marshal(m); seen = append(seen, string(b)) }
	_, err := c.acquire(&lockdv1.AcquireRequest{SessionId: other, Seq: 1, Name: "job"})
	if reason(err) != lockdv1.ErrorReason_ERROR_REASON_BUSY {
		t.Fatalf("busy: %v", err)
	}
	seen = append(seen, err.Error())
	for _, d := range errorDetails(err) {
		add(d)
	}
	d, err := c.svc.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: "job"}))
	if err != nil {
		t.Fatal(err)
	}
	add(d.Msg)
	l, err := c.svc.ListLocks(ctx, connect.NewRequest(&lockdv1.ListLocksRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	add(l.Msg)
	ss, err := c.svc.ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	add(ss.Msg)
	st, err := c.svc.Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	add(st.Msg)
	srv.Stop()
	seen = append(seen, logs.String()) // Stop is idempotent: Cleanup's call is a no-op
	all := strings.Join(seen, "\n")
	if !strings.Contains(all, holder) {
		t.Fatalf("the answers do not even name the holder's session %s", holder)
	}
	if strings.Contains(all, rawSecret) {
		t.Fatalf("a secret was shown:\n%s", all)
	}
}

// syncWriter serializes writes to w (the server logs from many goroutines).
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// errorDetails returns the details of a Connect error.
func errorDetails(err error) []proto.Message {
	var out []proto.Message
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				out = append(out, v)
			}
		}
	}
	return out
}
