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

// h2c returns an HTTP client speaking HTTP/2 cleartext only.
func h2c() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// rawStream opens a session stream and reads its first (open) frame.
func rawStream(t *testing.T, url string) *connect.BidiStreamForClient[lockdv1.StreamRequest, lockdv1.StreamResponse] {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	st := lockdv1connect.NewSessionServiceClient(h2c(), url).Stream(ctx)
	if err := st.Send(nil); err != nil {
		t.Fatal(err)
	}
	open, err := st.Receive()
	if err != nil {
		t.Fatalf("open frame: %v", err)
	}
	if open.GetCallId() != 0 || open.GetClusterId() == "" {
		t.Fatalf("open frame %v", open)
	}
	return st
}

func roundTrip(t *testing.T, st *connect.BidiStreamForClient[lockdv1.StreamRequest, lockdv1.StreamResponse], req *lockdv1.StreamRequest) *lockdv1.StreamResponse {
	t.Helper()
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	r, err := st.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if r.GetCallId() != req.GetCallId() {
		t.Fatalf("answer to call %d, want %d", r.GetCallId(), req.GetCallId())
	}
	return r
}

// Malformed frames are answered with a StreamError (the code and reason a
// unary call would get) and the stream goes on serving.
func TestStreamRefusesMalformedFrames(t *testing.T) {
	srv := lockdtest.New(t)
	st := rawStream(t, srv.URL())
	tooMany := &lockdv1.KeepAliveBatch{}
	for range 1001 {
		tooMany.Sessions = append(tooMany.Sessions, &lockdv1.KeepAliveRequest{SessionId: "x"})
	}
	for i, req := range []*lockdv1.StreamRequest{
		{CallId: 1},
		{CallId: 0, Body: &lockdv1.StreamRequest_Release{Release: &lockdv1.ReleaseRequest{SessionId: "s", Seq: 1, Name: "a"}}},
		{CallId: 3, Body: &lockdv1.StreamRequest_Acquire{Acquire: &lockdv1.AcquireRequest{}}},
		{CallId: 4, Body: &lockdv1.StreamRequest_Acquire{}},
		{CallId: 5, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: &lockdv1.KeepAliveBatch{}}},
		{CallId: 6, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: tooMany}},
		{CallId: 7, Body: &lockdv1.StreamRequest_CreateSession{CreateSession: &lockdv1.CreateSessionRequest{Ttl: durationpb.New(-time.Second)}}},
	} {
		r := roundTrip(t, st, req)
		e := r.GetError()
		if e == nil || connect.Code(e.GetCode()) != connect.CodeInvalidArgument && e.GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND {
			t.Errorf("frame %d (%v): answer %v, want an invalid-argument StreamError", i, req, r)
		}
	}
	// Still serving: a session, kept alive in a batch with an unknown one.
	r := roundTrip(t, st, &lockdv1.StreamRequest{CallId: 8, Body: &lockdv1.StreamRequest_CreateSession{CreateSession: &lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}}})
	id, secret := r.GetCreateSession().GetSessionId(), r.GetCreateSession().GetSecret()
	if id == "" {
		t.Fatalf("create session: %v", r)
	}
	r = roundTrip(t, st, &lockdv1.StreamRequest{CallId: 9, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: &lockdv1.KeepAliveBatch{
		Sessions: []*lockdv1.KeepAliveRequest{{SessionId: id, Secret: secret}, {SessionId: "gone"}},
	}}})
	res := r.GetKeepAlive().GetResults()
	if len(res) != 2 || res[0].GetTtl().AsDuration() != time.Minute || res[0].GetError() != nil ||
		res[1].GetError().GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND {
		t.Fatalf("keepalive batch answer %v", r)
	}
}

// Over HTTP/1.1 no stream opens (Connect needs HTTP/2 for a bidi stream):
// that is what the client's fallback detects.
func TestStreamNeedsHTTP2(t *testing.T) {
	srv := lockdtest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st := lockdv1connect.NewSessionServiceClient(&http.Client{Transport: &http.Transport{}}, srv.URL()).Stream(ctx)
	_ = st.Send(nil)
	if _, err := st.Receive(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "http") {
		t.Fatalf("stream over HTTP/1.1: %v, want an error", err)
	}
}

// Frames sent back to back, more than one worker serves at once, are each
// answered once, and the answers queued when the client closes its side
// are all written before the stream ends.
func TestStreamPipelinedFramesAllAnswered(t *testing.T) {
	srv := lockdtest.New(t)
	st := rawStream(t, srv.URL())
	const n = 300
	for i := range n {
		req := &lockdv1.StreamRequest{CallId: uint64(i + 1)}
		if i%3 == 0 {
			req.Body = &lockdv1.StreamRequest_CreateSession{CreateSession: &lockdv1.CreateSessionRequest{Ttl: durationpb.New(time.Minute)}}
		}
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for {
		r, err := st.Receive()
		if err != nil {
			break
		}
		id := r.GetCallId()
		if seen[id] {
			t.Fatalf("call %d answered twice", id)
		}
		seen[id] = true
		if id%3 == 1 && r.GetCreateSession().GetSessionId() == "" {
			t.Errorf("call %d: %v, want a session", id, r)
		}
		if id%3 != 1 && r.GetError() == nil {
			t.Errorf("call %d without a body: %v, want an error", id, r)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d of %d calls answered before the stream ended", len(seen), n)
	}
}
