package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// TestProtocolFacts checks, against a real `lockd serve`, the facts of
// docs/protocol.md a client author builds on, over plain HTTP and JSON
// (no lockd code): the stateless recipe, what a repeated seq returns, the
// fingerprint and ack rules, the error details and JSON's omitted
// defaults. If one fails, the server changed or the page is wrong.
func TestProtocolFacts(t *testing.T) {
	c := startCluster(t, 1)
	u := c.nodes[0].url() + "/lockd.v1.LockService/"
	call := func(method string, body map[string]any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		resp, err := http.Post(u+method, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out := map[string]any{}
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s: %v: %s", method, err, raw)
		}
		if resp.StatusCode == http.StatusOK && resp.Header.Get("Lockd-Cluster-Id") == "" {
			t.Errorf("%s: no Lockd-Cluster-Id header", method)
		}
		return resp.StatusCode, out
	}
	// reason returns an error answer's code and ErrorDetail reason (from
	// the decoded "debug" form).
	reason := func(out map[string]any) string {
		ds, _ := out["details"].([]any)
		for _, d := range ds {
			m, _ := d.(map[string]any)
			if m["type"] != "lockd.v1.ErrorDetail" {
				continue
			}
			dbg, _ := m["debug"].(map[string]any)
			r, _ := dbg["reason"].(string)
			return fmt.Sprint(out["code"]) + "/" + strings.TrimPrefix(r, "ERROR_REASON_")
		}
		return fmt.Sprint(out["code"]) + "/(no detail)"
	}
	want := func(what string, out map[string]any, code string) {
		t.Helper()
		if got := reason(out); got != code {
			t.Errorf("%s: %s, want %s (%v)", what, got, code, out)
		}
	}
	const secret = "0123456789abcdef0123456789abcdef"
	create := map[string]any{"ttl": "30s", "owner": "facts", "requestId": "facts-1", "secret": secret}
	_, s := call("CreateSession", create)
	id, _ := s["sessionId"].(string)
	if id == "" || s["ttl"] != "30s" || s["secret"] != secret || s["clusterId"] == "" {
		t.Fatalf("CreateSession: %v", s)
	}
	// The recipe's deadline: sent + 30 s − 1 % − max(100 ms, 2 %).
	t.Logf("client deadline sent+%v", 30*time.Second-300*time.Millisecond-600*time.Millisecond)
	// A retry with the same request id and secret: the same session.
	if _, again := call("CreateSession", create); again["sessionId"] != id {
		t.Errorf("CreateSession retry: %v, want session %s", again, id)
	}
	// The same request id without the secret: refused (a server-made
	// secret is not retry-safe).
	_, noSecret := call("CreateSession", map[string]any{"ttl": "30s", "owner": "facts", "requestId": "facts-1"})
	want("CreateSession retry without the secret", noSecret, "permission_denied/PERMISSION_DENIED")
	acq := func(seq, ack int, name string, extra ...any) map[string]any {
		body := map[string]any{"sessionId": id, "secret": secret, "seq": fmt.Sprint(seq), "ack": fmt.Sprint(ack), "name": name}
		for i := 0; i+1 < len(extra); i += 2 {
			body[extra[i].(string)] = extra[i+1]
		}
		_, out := call("Acquire", body)
		return out
	}
	g := acq(1, 1, "facts/a")
	tok, _ := g["token"].(string) // uint64 as a decimal string
	if g["status"] != "ACQUIRE_STATUS_GRANTED" || tok == "" {
		t.Fatalf("Acquire: %v", g)
	}
	if again := acq(1, 1, "facts/a"); again["token"] != tok {
		t.Errorf("repeated seq: %v, want the first answer (token %s)", again, tok)
	}
	want("seq reused for another lock", acq(1, 1, "facts/b"), "invalid_argument/INVALID_ARGUMENT")
	want("seq reused with another mode", acq(1, 1, "facts/a", "mode", "MODE_SHARED"), "invalid_argument/INVALID_ARGUMENT")
	want("seq 0", acq(0, 1, "facts/z"), "invalid_argument/INVALID_ARGUMENT")
	want("re-entrant acquire", acq(2, 2, "facts/a"), "already_exists/ALREADY_HELD")
	// ack 3 raises the floor: answers below it are forgotten. A repeat of
	// an acquire whose hold still lives is answered from the state (its
	// token); any other request below the floor is refused.
	acq(3, 3, "facts/c")
	if again := acq(1, 3, "facts/a"); again["token"] != tok {
		t.Errorf("repeat of a live acquire below the floor: %v, want token %s", again, tok)
	}
	want("seq below the floor", acq(2, 3, "facts/a"), "invalid_argument/INVALID_ARGUMENT")
	// Wrong secret: refused before anything else.
	_, ka := call("KeepAlive", map[string]any{"sessionId": id, "secret": "wrong-wrong-wrong-wrong"})
	want("wrong secret", ka, "permission_denied/PERMISSION_DENIED")
	if _, ka := call("KeepAlive", map[string]any{"sessionId": id, "secret": secret}); ka["ttl"] != "30s" {
		t.Errorf("KeepAlive: %v", ka)
	}
	// JSON leaves defaults out: a dead token checks as {}.
	if _, ct := call("CheckToken", map[string]any{"name": "facts/a", "token": "1"}); len(ct) != 0 {
		t.Errorf("CheckToken of a dead token: %v, want {}", ct)
	}
	if _, ct := call("CheckToken", map[string]any{"name": "facts/a", "token": tok}); ct["valid"] != true || ct["sessionId"] != id {
		t.Errorf("CheckToken of the current token: %v", ct)
	}
	// Another session: busy names the holder; a long poll answers QUEUED
	// and its repeat (same seq) resumes the same wait.
	_, s2 := call("CreateSession", map[string]any{"ttl": "30s", "owner": "other", "requestId": "facts-2", "secret": secret + "2"})
	id2, _ := s2["sessionId"].(string)
	acq2 := func(seq int, extra ...any) map[string]any {
		body := map[string]any{"sessionId": id2, "secret": secret + "2", "seq": fmt.Sprint(seq), "ack": fmt.Sprint(seq), "name": "facts/a"}
		for i := 0; i+1 < len(extra); i += 2 {
			body[extra[i].(string)] = extra[i+1]
		}
		_, out := call("Acquire", body)
		return out
	}
	busy := acq2(1)
	want("try of a held lock", busy, "failed_precondition/BUSY")
	if !strings.Contains(fmt.Sprint(busy), "owner:facts") {
		t.Errorf("busy does not name the holder's owner: %v", busy)
	}
	for range 2 {
		if q := acq2(2, "wait", true, "pollTimeout", "0.2s"); q["status"] != "ACQUIRE_STATUS_QUEUED" || fmt.Sprint(q["position"]) != "1" {
			t.Errorf("long poll: %v, want QUEUED at position 1", q)
		}
	}
	_, rel := call("Release", map[string]any{"sessionId": id, "secret": secret, "seq": "4", "ack": "4", "name": "facts/a", "token": tok})
	if len(rel) != 0 {
		t.Errorf("Release: %v", rel)
	}
	got := acq2(2, "wait", true, "pollTimeout", "5s")
	if got["status"] != "ACQUIRE_STATUS_GRANTED" {
		t.Fatalf("the waiter after the release: %v", got)
	}
	// Cancel of a wait that was granted meanwhile releases the grant.
	if _, cn := call("Cancel", map[string]any{"sessionId": id2, "secret": secret + "2", "seq": "3", "ack": "3", "name": "facts/a", "acquireSeq": "2"}); cn["released"] != true {
		t.Errorf("Cancel of a granted wait: %v, want released", cn)
	}
	// Close is idempotent: a closed session closes again with OK, while
	// other calls on it answer not found.
	for range 2 {
		if code, cl := call("CloseSession", map[string]any{"sessionId": id, "secret": secret, "seq": "5"}); code != http.StatusOK || len(cl) != 0 {
			t.Errorf("CloseSession: %d %v", code, cl)
		}
	}
	want("acquire on a closed session", acq(6, 6, "facts/d"), "not_found/SESSION_NOT_FOUND")
}

// TestStreamFacts checks the session stream's framing of
// docs/protocol.md against a real server with the generated Connect
// client over h2c: the opening frame (call_id 0, no body), answers by
// call_id, call_id 0 refused with a StreamError, a keepalive batch
// answered in the batch's order, and a follower's NOT_LEADER for a batch.
func TestStreamFacts(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(t, c.nodes, 30*time.Second)
	var follower *server
	for _, s := range c.nodes {
		if s != leader {
			follower = s
			break
		}
	}
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: tr}
	open := func(s *server) *connect.BidiStreamForClient[lockdv1.StreamRequest, lockdv1.StreamResponse] {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		st := lockdv1connect.NewSessionServiceClient(hc, s.url()).Stream(ctx)
		if err := st.Send(nil); err != nil {
			t.Fatalf("open stream: %v", err)
		}
		hello, err := st.Receive()
		if err != nil || hello.GetCallId() != 0 || hello.GetBody() != nil || hello.GetClusterId() == "" {
			t.Fatalf("first frame: %v, %v; want call_id 0, no body, a cluster id", hello, err)
		}
		return st
	}
	st := open(leader)
	const secret = "0123456789abcdef0123456789abcdef"
	var ids []string
	for i := range 3 {
		id := uint64(10 + i)
		if err := st.Send(&lockdv1.StreamRequest{CallId: id, Body: &lockdv1.StreamRequest_CreateSession{CreateSession: &lockdv1.CreateSessionRequest{
			Ttl: durationpb.New(10 * time.Second), Owner: "stream-facts", RequestId: fmt.Sprintf("sf-%d", i), Secret: secret}}}); err != nil {
			t.Fatal(err)
		}
		r, err := st.Receive()
		if err != nil || r.GetCallId() != id || r.GetCreateSession().GetSessionId() == "" {
			t.Fatalf("create on the stream: %v, %v", r, err)
		}
		ids = append(ids, r.GetCreateSession().GetSessionId())
	}
	if err := st.Send(&lockdv1.StreamRequest{CallId: 0, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: &lockdv1.KeepAliveBatch{}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Receive(); err != nil || r.GetError().GetCode() != uint32(connect.CodeInvalidArgument) {
		t.Errorf("call_id 0: %v, %v; want a StreamError with code 3", r, err)
	}
	batch := &lockdv1.KeepAliveBatch{}
	for _, id := range []string{ids[2], ids[0], ids[1]} {
		batch.Sessions = append(batch.Sessions, &lockdv1.KeepAliveRequest{SessionId: id, Secret: secret})
	}
	batch.Sessions = append(batch.Sessions, &lockdv1.KeepAliveRequest{SessionId: ids[0], Secret: "wrong-wrong-wrong-wrong"})
	if err := st.Send(&lockdv1.StreamRequest{CallId: 20, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: batch}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Receive()
	if err != nil || r.GetCallId() != 20 {
		t.Fatalf("batch: %v, %v", r, err)
	}
	res := r.GetKeepAlive().GetResults()
	if len(res) != 4 {
		t.Fatalf("batch of 4: %d results", len(res))
	}
	for i, want := range []string{ids[2], ids[0], ids[1]} {
		if res[i].GetSessionId() != want || res[i].GetTtl().AsDuration() != 10*time.Second || res[i].GetError() != nil {
			t.Errorf("result %d: %v, want session %s renewed for 10s", i, res[i], want)
		}
	}
	if e := res[3].GetError(); e.GetCode() != uint32(connect.CodePermissionDenied) || e.GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED {
		t.Errorf("wrong secret in a batch: %v, want its own PERMISSION_DENIED", res[3])
	}
	fs := open(follower)
	if err := fs.Send(&lockdv1.StreamRequest{CallId: 1, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: &lockdv1.KeepAliveBatch{Sessions: batch.Sessions[:1]}}}); err != nil {
		t.Fatal(err)
	}
	r, err = fs.Receive()
	if err != nil || r.GetError().GetDetail().GetReason() != lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER || r.GetError().GetDetail().GetLeaderApi() != leader.url() {
		t.Errorf("batch on a follower: %v, %v; want NOT_LEADER naming %s", r, err, leader.url())
	}
}
