package server_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/rpcs"
	"github.com/lockd-dev/lockd/internal/wire"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// upgradeRequest is the HTTP/1.1 request that asks for a session stream on
// its own connection (docs/protocol.md), with extra header lines.
func upgradeRequest(host string, extra ...string) string {
	return "POST " + lockdv1connect.SessionServiceStreamProcedure + " HTTP/1.1\r\n" +
		"Host: " + host + "\r\n" +
		"Content-Type: application/connect+proto\r\n" +
		"Connect-Protocol-Version: 1\r\n" +
		"Connection: Upgrade\r\n" +
		"Upgrade: " + rpcs.StreamUpgrade + "\r\n" +
		"Content-Length: 0\r\n" + strings.Join(extra, "") + "\r\n"
}

// dialUpgrade sends req to the node at u and returns the connection with
// the response's status line and headers read.
func dialUpgrade(t *testing.T, u, req string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", pu.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, br, resp
}

// writeEnvelope writes m as one Connect envelope.
func writeEnvelope(t *testing.T, w io.Writer, m proto.Message) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var prefix [5]byte
	binary.BigEndian.PutUint32(prefix[1:], uint32(len(b)))
	if _, err := w.Write(append(prefix[:], b...)); err != nil {
		t.Fatal(err)
	}
}

// readFrame reads one Connect envelope: its flags and its bytes.
func readFrame(r io.Reader) (flags byte, b []byte, err error) {
	var prefix [5]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return 0, nil, err
	}
	b = make([]byte, binary.BigEndian.Uint32(prefix[1:]))
	_, err = io.ReadFull(r, b)
	return prefix[0], b, err
}

// readEnvelope reads one Connect envelope into a StreamResponse; a flag
// other than 0 (the end of the stream) fails the test with its text.
func readEnvelope(t *testing.T, r io.Reader) *lockdv1.StreamResponse {
	t.Helper()
	flags, b, err := readFrame(r)
	if err != nil {
		t.Fatal(err)
	}
	if flags != 0 {
		t.Fatalf("end of stream (flags %#x): %s", flags, b)
	}
	m := new(lockdv1.StreamResponse)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The upgrade as written in docs/protocol.md, byte for byte from a raw TCP
// connection: 101, the open frame, then frames both ways; the connection's
// end ends the stream, not the session.
func TestStreamUpgradeRawProtocol(t *testing.T) {
	srv := lockdtest.New(t)
	host := strings.TrimPrefix(srv.URL(), "http://")
	c, br, resp := dialUpgrade(t, srv.URL(), upgradeRequest(host))
	if resp.StatusCode != http.StatusSwitchingProtocols || !strings.EqualFold(resp.Header.Get("Upgrade"), rpcs.StreamUpgrade) {
		t.Fatalf("answer %s (Upgrade %q), want 101 %s", resp.Status, resp.Header.Get("Upgrade"), rpcs.StreamUpgrade)
	}
	if open := readEnvelope(t, br); open.GetCallId() != 0 || open.GetClusterId() == "" {
		t.Fatalf("open frame %v", open)
	}
	// Two frames written at once are both answered.
	writeEnvelope(t, c, &lockdv1.StreamRequest{CallId: 1, Body: &lockdv1.StreamRequest_CreateSession{
		CreateSession: &lockdv1.CreateSessionRequest{Ttl: durationpb.New(10 * time.Second), RequestId: "upgrade-raw-1"}}})
	writeEnvelope(t, c, &lockdv1.StreamRequest{CallId: 2, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: &lockdv1.KeepAliveBatch{}}})
	got := map[uint64]*lockdv1.StreamResponse{}
	for range 2 {
		r := readEnvelope(t, br)
		got[r.GetCallId()] = r
	}
	sid := got[1].GetCreateSession().GetSessionId()
	if sid == "" || got[2].GetError() == nil {
		t.Fatalf("answers %v, want a session for call 1 and an invalid-argument error for the empty batch (call 2)", got)
	}
	// Nothing more is asked: the node's heartbeat (an empty frame with
	// call_id 0) comes before the Go client would take the node for
	// frozen.
	_ = c.SetReadDeadline(time.Now().Add(wire.SilenceLimit)) // what the Go client allows a live node
	if hb := readEnvelope(t, br); hb.GetCallId() != 0 || hb.GetBody() != nil {
		t.Fatalf("frame %v, want a heartbeat (call_id 0, no body)", hb)
	}
	c.Close()
	// The session outlives its connection.
	cl, err := lockd.New(lockd.WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	ls, err := cl.Service().ListSessions(t.Context(), connect.NewRequest(&lockdv1.ListSessionsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range ls.Msg.GetSessions() {
		found = found || s.GetSessionId() == sid
	}
	if !found {
		t.Fatalf("session %s gone after its stream's connection closed", sid)
	}
}

// The Host check and the request's form are judged before the connection
// is handed over (an HTTP answer, no 101); credentials after it, by the
// stream's handler, as over HTTP/2: a missing token gets the 101 and then
// the end of the stream with UNAUTHENTICATED.
func TestStreamUpgradeRefusedBeforeHandover(t *testing.T) {
	srv := lockdtest.New(t, lockdtest.WithAuthFile(writeAuthFile(t)))
	host := strings.TrimPrefix(srv.URL(), "http://")
	for _, tc := range []struct {
		name string
		req  string
		want int
	}{
		{"foreign host", upgradeRequest("evil.example:80", "Authorization: Bearer "+billingToken+"\r\n"), http.StatusForbidden},
		{"no token", upgradeRequest(host), http.StatusOK}, // Connect's own error frame: checked below
		{"a body", strings.Replace(upgradeRequest(host, "Authorization: Bearer "+billingToken+"\r\n"), "Content-Length: 0", "Content-Length: 1", 1) + "x", http.StatusBadRequest},
		{"GET", strings.Replace(upgradeRequest(host, "Authorization: Bearer "+billingToken+"\r\n"), "POST ", "GET ", 1), http.StatusBadRequest},
		{"gRPC", strings.Replace(upgradeRequest(host, "Authorization: Bearer "+billingToken+"\r\n"), "application/connect+proto", "application/grpc", 1), http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br, resp := dialUpgrade(t, srv.URL(), tc.req)
			_ = c
			if resp.StatusCode == http.StatusSwitchingProtocols && tc.want != http.StatusOK {
				t.Fatalf("upgraded, want %d", tc.want)
			}
			if tc.want != http.StatusOK {
				if resp.StatusCode != tc.want {
					t.Fatalf("status %s, want %d", resp.Status, tc.want)
				}
				return
			}
			// Without a token the stream is upgraded (the guard lets the
			// request through to the stream's handler, as over HTTP/2)
			// and its first frame is the end of the stream with
			// UNAUTHENTICATED.
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("status %s, want 101 then an error frame", resp.Status)
			}
			flags, b, err := readFrame(br)
			if err != nil {
				t.Fatal(err)
			}
			if flags&2 == 0 || !strings.Contains(string(b), "unauthenticated") {
				t.Fatalf("first frame (flags %#x) %s, want the end of the stream with unauthenticated", flags, b)
			}
		})
	}
}

// A node's Close ends its upgraded streams, which net/http's shutdown does
// not track, and returns.
func TestStreamUpgradeEndsWithNodeClose(t *testing.T) {
	srv := lockdtest.New(t)
	host := strings.TrimPrefix(srv.URL(), "http://")
	c, br, resp := dialUpgrade(t, srv.URL(), upgradeRequest(host))
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("answer %s, want 101", resp.Status)
	}
	readEnvelope(t, br) // the open frame
	stopped := make(chan struct{})
	go func() {
		srv.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the node's Close did not return with an upgraded stream open")
	}
	// What is left to read ends: heartbeats, then the end of the stream
	// or the connection's close.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		flags, _, err := readFrame(br)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the upgraded connection stayed open after the node closed")
		}
		if err != nil || flags&2 != 0 {
			return // the connection's close, or the end of the stream
		}
	}
}
