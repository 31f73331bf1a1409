package server_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// SubscribeNotices on a raw stream: refused without the session's secret
// or for an unknown session; accepted, it is answered first, then the
// request made before it arrives (call_id 0), then each later one as it
// is applied.
func TestStreamSubscribeNotices(t *testing.T) {
	srv := lockdtest.New(t)
	st := rawStream(t, srv.URL())
	r := roundTrip(t, st, &lockdv1.StreamRequest{CallId: 1, Body: &lockdv1.StreamRequest_CreateSession{CreateSession: &lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}}})
	id, secret := r.GetCreateSession().GetSessionId(), r.GetCreateSession().GetSecret()
	r = roundTrip(t, st, &lockdv1.StreamRequest{CallId: 2, Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{
		SessionId: id, Secret: secret, Seq: 1, Name: "batch"}}})
	token := r.GetAcquire().GetToken()
	if token == 0 {
		t.Fatalf("acquire: %v", r)
	}
	lc := lockdv1connect.NewLockServiceClient(h2c(), srv.URL())
	ask := func(reason string) {
		t.Helper()
		if _, err := lc.RequestRelease(t.Context(), connect.NewRequest(&lockdv1.RequestReleaseRequest{Name: "batch", Reason: reason})); err != nil {
			t.Fatal(err)
		}
	}
	ask("before")

	subscribe := func(callID uint64, id, secret string) *lockdv1.StreamResponse {
		return roundTrip(t, st, &lockdv1.StreamRequest{CallId: callID, Body: &lockdv1.StreamRequest_SubscribeNotices{
			SubscribeNotices: &lockdv1.SubscribeNoticesRequest{SessionId: id, Secret: secret}}})
	}
	if e := subscribe(3, id, "wrong").GetError(); connect.Code(e.GetCode()) != connect.CodePermissionDenied {
		t.Errorf("wrong secret: %v, want PERMISSION_DENIED", e)
	}
	if e := subscribe(4, "nosuchsession", "x").GetError(); e.GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND {
		t.Errorf("unknown session: %v, want SESSION_NOT_FOUND", e)
	}
	if r := subscribe(5, id, secret); r.GetSubscribeNotices() == nil {
		t.Fatalf("subscribe: %v", r)
	}
	next := func() *lockdv1.ReleaseRequested {
		t.Helper()
		n, err := st.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if n.GetCallId() != 0 || n.GetReleaseRequested() == nil {
			t.Fatalf("frame %v, want a notice", n)
		}
		return n.GetReleaseRequested()
	}
	n := next()
	if n.GetSessionId() != id || n.GetName() != "batch" || n.GetToken() != token || n.GetReason() != "before" || n.GetRequestedAt() == nil {
		t.Fatalf("pending notice %v", n)
	}
	ask("after")
	// Read from the state: the first request's reason and time.
	if n2 := next(); n2.GetToken() != token || n2.GetReason() != "before" || !n2.GetRequestedAt().AsTime().Equal(n.GetRequestedAt().AsTime()) {
		t.Fatalf("live notice %v, want the pending request's fields again", n2)
	}
}
