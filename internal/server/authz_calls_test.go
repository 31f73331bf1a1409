package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// TestAuthCoversEveryCall checks the calls added beside the session
// calls: SetValue (Proclaim) needs the session's secret and lock on the
// name, ClearMark needs admin, and Watch (Connect stream and SSE) needs
// read on its prefix. Without these rows in accessOf any known token could
// clear a mark or watch every lock.
func TestAuthCoversEveryCall(t *testing.T) {
	srv := lockdtest.New(t, lockdtest.WithAuthFile(writeAuthFile(t)))
	ctx := t.Context()
	billing := tokenClient(srv.URL(), billingToken, nil)
	reader := tokenClient(srv.URL(), readerToken, nil)
	admin := tokenClient(srv.URL(), adminToken, nil)

	s, err := billing.CreateSession(ctx, connect.NewRequest(&lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	sid, sec := s.Msg.SessionId, s.Msg.Secret
	g, err := billing.Acquire(ctx, connect.NewRequest(&lockdv1.AcquireRequest{SessionId: sid, Secret: sec, Seq: 1, Name: "billing/leader"}))
	if err != nil {
		t.Fatal(err)
	}
	tok := g.Msg.Token

	// SetValue: the secret is required, like every session call.
	_, err = billing.SetValue(ctx, connect.NewRequest(&lockdv1.SetValueRequest{SessionId: sid, Seq: 2, Name: "billing/leader", Token: tok, Value: []byte("x")}))
	wantCode(t, "SetValue without the secret", err, connect.CodePermissionDenied)
	_, err = reader.SetValue(ctx, connect.NewRequest(&lockdv1.SetValueRequest{SessionId: sid, Secret: sec, Seq: 3, Name: "billing/leader", Token: tok, Value: []byte("x")}))
	wantCode(t, "SetValue by a read-only identity", err, connect.CodePermissionDenied)
	if _, err := billing.SetValue(ctx, connect.NewRequest(&lockdv1.SetValueRequest{SessionId: sid, Secret: sec, Seq: 4, Name: "billing/leader", Token: tok, Value: []byte("x")})); err != nil {
		t.Errorf("SetValue by the holder: %v", err)
	}

	// ClearMark: admin only.
	for name, c := range map[string]lockdv1connect.LockServiceClient{"billing-app": billing, "dashboard": reader} {
		_, err := c.ClearMark(ctx, connect.NewRequest(&lockdv1.ClearMarkRequest{Name: "billing/leader"}))
		wantCode(t, name+" ClearMark", err, connect.CodePermissionDenied)
	}
	if _, err := admin.ClearMark(ctx, connect.NewRequest(&lockdv1.ClearMarkRequest{Name: "billing/leader"})); err != nil {
		t.Errorf("admin ClearMark: %v", err)
	}

	// Watch over Connect: read on the prefix.
	watch := func(token, prefix string) error {
		c := lockdv1connect.NewWatchServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(streamToken(token)))
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := c.Watch(wctx, connect.NewRequest(&lockdv1.WatchRequest{Prefix: prefix, State: true}))
		if err != nil {
			return err
		}
		defer st.Close()
		st.Receive() // the first message, or the refusal
		return st.Err()
	}
	wantCode(t, "billing watches payments/", watch(billingToken, "payments/"), connect.CodePermissionDenied)
	wantCode(t, "no token watches", watch("", "billing/"), connect.CodeUnauthenticated)
	if err := watch(billingToken, "billing/"); err != nil {
		t.Errorf("billing watches billing/: %v", err)
	}

	// get makes one HTTP call and returns its status.
	get := func(method, path, token, body string) int {
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL()+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	// Watch over SSE: the same rule, as HTTP statuses.
	sse := func(token, prefix string) int { return get(http.MethodGet, "/v1/watch?prefix="+prefix, token, "") }
	if got := sse(billingToken, "payments/"); got != http.StatusForbidden {
		t.Errorf("SSE billing watches payments/: %d, want 403", got)
	}
	if got := sse("", "billing/"); got != http.StatusUnauthorized {
		t.Errorf("SSE without a token: %d, want 401", got)
	}
	if got := sse(readerToken, ""); got != http.StatusOK {
		t.Errorf("SSE reader watches everything: %d, want 200", got)
	}

	// The gRPC health service is open (probes carry no token); the
	// dashboard's member health, which makes the node probe every member,
	// is not.
	if got := get(http.MethodPost, "/grpc.health.v1.Health/Check", "", "{}"); got != http.StatusOK {
		t.Errorf("gRPC health check without a token: %d, want 200", got)
	}
	if got := get(http.MethodGet, "/ui/api/health", "", ""); got != http.StatusUnauthorized {
		t.Errorf("member health without a token: %d, want 401", got)
	}
	if got := get(http.MethodGet, "/ui/api/health", readerToken, ""); got != http.StatusOK {
		t.Errorf("member health with a token: %d, want 200", got)
	}
}

// streamToken sets a bearer token on streaming calls ("" none).
type streamToken string

func (t streamToken) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (t streamToken) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if t != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(t))
		}
		return conn
	}
}

func (t streamToken) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
