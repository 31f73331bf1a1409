package wire

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// rowFacts is what the client decides per request from its row: whether a
// resend after an unknown outcome is safe, whether the request goes over
// the session stream as a frame of its own, and the lock named in errors.
type rowFacts struct {
	idempotent, streamed bool
	name                 string
}

func facts[Req, Res any](r RPC[Req, Res], msg *Req) rowFacts {
	return rowFacts{r.PolicyOf(msg).Idempotent, r.streamed(), r.name(msg)}
}

// TestClientRows pins each client row as the client's own policy table
// decided it before the shared method table: resent after an unknown
// outcome only when the server deduplicates it (a seq, a request id, a
// mark's token) or it is a read or a repeatable change; ForceRelease and
// TransferLeadership never; the six session calls over the stream; the
// lock name in errors for the calls that name one lock.
func TestClientRows(t *testing.T) {
	no, always := rowFacts{}, rowFacts{idempotent: true}
	cases := []struct {
		what      string
		got, want rowFacts
	}{
		{"CreateSession", facts(CreateSession, &lockdv1.CreateSessionRequest{}), rowFacts{streamed: true}},
		{"CreateSession with request id", facts(CreateSession, &lockdv1.CreateSessionRequest{RequestId: "r"}), rowFacts{idempotent: true, streamed: true}},
		{"KeepAlive", facts(KeepAlive, &lockdv1.KeepAliveRequest{}), always},
		{"CloseSession", facts(CloseSession, &lockdv1.CloseSessionRequest{}), rowFacts{streamed: true}},
		{"CloseSession with seq", facts(CloseSession, &lockdv1.CloseSessionRequest{Seq: 1}), rowFacts{idempotent: true, streamed: true}},
		{"ListSessions", facts(ListSessions, &lockdv1.ListSessionsRequest{}), always},
		{"Acquire", facts(Acquire, &lockdv1.AcquireRequest{Name: "x"}), rowFacts{streamed: true, name: "x"}},
		{"Acquire with seq", facts(Acquire, &lockdv1.AcquireRequest{Name: "x", Seq: 1}), rowFacts{true, true, "x"}},
		{"Release", facts(Release, &lockdv1.ReleaseRequest{Name: "x"}), rowFacts{streamed: true, name: "x"}},
		{"Release with seq", facts(Release, &lockdv1.ReleaseRequest{Name: "x", Seq: 1}), rowFacts{true, true, "x"}},
		{"Cancel", facts(Cancel, &lockdv1.CancelRequest{Name: "x"}), rowFacts{streamed: true, name: "x"}},
		{"Cancel with seq", facts(Cancel, &lockdv1.CancelRequest{Name: "x", Seq: 1}), rowFacts{true, true, "x"}},
		{"Complete", facts(Complete, &lockdv1.CompleteRequest{Name: "x"}), rowFacts{streamed: true, name: "x"}},
		{"Complete with seq", facts(Complete, &lockdv1.CompleteRequest{Name: "x", Seq: 1}), rowFacts{true, true, "x"}},
		{"SetValue", facts(SetValue, &lockdv1.SetValueRequest{Name: "x"}), rowFacts{name: "x"}},
		{"SetValue with seq", facts(SetValue, &lockdv1.SetValueRequest{Name: "x", Seq: 1}), rowFacts{idempotent: true, name: "x"}},
		{"CheckToken", facts(CheckToken, &lockdv1.CheckTokenRequest{Name: "x"}), rowFacts{idempotent: true, name: "x"}},
		{"DescribeLock", facts(DescribeLock, &lockdv1.DescribeLockRequest{Name: "x"}), rowFacts{idempotent: true, name: "x"}},
		{"ListLocks", facts(ListLocks, &lockdv1.ListLocksRequest{Prefix: "x/"}), always},
		{"ForceRelease", facts(ForceRelease, &lockdv1.ForceReleaseRequest{Name: "x"}), rowFacts{name: "x"}},
		{"ClearMark", facts(ClearMark, &lockdv1.ClearMarkRequest{Name: "x"}), rowFacts{name: "x"}},
		{"ClearMark with token", facts(ClearMark, &lockdv1.ClearMarkRequest{Name: "x", Token: 7}), rowFacts{idempotent: true, name: "x"}},
		{"Status", facts(Status, &lockdv1.StatusRequest{}), always},
		{"Join", facts(Join, &lockdv1.JoinRequest{NodeId: "n"}), always},
		{"RemoveMember", facts(RemoveMember, &lockdv1.RemoveMemberRequest{NodeId: "n"}), always},
		{"TransferLeadership", facts(TransferLeadership, &lockdv1.TransferLeadershipRequest{NodeId: "n"}), no},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: %+v, want %+v", c.what, c.got, c.want)
		}
	}
	if Acquire.MaxPoll != maxLongPoll || Release.MaxPoll != 0 {
		t.Errorf("long poll: Acquire %v, Release %v; want %v and 0", Acquire.MaxPoll, Release.MaxPoll, maxLongPoll)
	}
}

// TestFramesMatchTable: the client's frames, built and read without
// reflection, are those of the shared table for every method a stream
// carries as a frame of its own (and the stream-only calls), and a frame of another kind is not taken
// for the answer.
func TestFramesMatchTable(t *testing.T) {
	reqs := map[string]proto.Message{
		"CreateSession":    &lockdv1.CreateSessionRequest{RequestId: "r"},
		"CloseSession":     &lockdv1.CloseSessionRequest{Seq: 1},
		"Acquire":          &lockdv1.AcquireRequest{Name: "x", Seq: 2},
		"Release":          &lockdv1.ReleaseRequest{Name: "x", Seq: 3},
		"Cancel":           &lockdv1.CancelRequest{Name: "x", Seq: 4},
		"Complete":         &lockdv1.CompleteRequest{Name: "x", Seq: 5},
		"SubscribeNotices": &lockdv1.SubscribeNoticesRequest{SessionId: "s"},
	}
	resps := map[string]proto.Message{
		"CreateSession":    &lockdv1.CreateSessionResponse{SessionId: "s"},
		"CloseSession":     &lockdv1.CloseSessionResponse{},
		"Acquire":          &lockdv1.AcquireResponse{Token: 1},
		"Release":          &lockdv1.ReleaseResponse{},
		"Cancel":           &lockdv1.CancelResponse{Released: true},
		"Complete":         &lockdv1.CompleteResponse{},
		"SubscribeNotices": &lockdv1.SubscribeNoticesResponse{},
	}
	for _, m := range rpcs.Frames() {
		if m.FrameRequest != "" && !m.StreamOnly {
			continue
		}
		req, resp := reqs[m.Name], resps[m.Name]
		if req == nil || resp == nil {
			t.Fatalf("%s: streamed, but not in this test", m.Name)
		}
		if got, want := wrapFrame(m, req), m.Wrap(req); !proto.Equal(got, want) {
			t.Errorf("%s: frame %v, want %v", m.Name, got, want)
		}
		frame := &lockdv1.StreamResponse{CallId: 9}
		m.SetAnswer(frame, resp)
		if got := answerOf(m, frame); got != any(resp) || got != any(m.Unwrap(frame)) {
			t.Errorf("%s: answer %v, want %v", m.Name, got, resp)
		}
	}
	errFrame := &lockdv1.StreamResponse{Body: &lockdv1.StreamResponse_Error{Error: &lockdv1.StreamError{Code: 5}}}
	acquire := rpcs.ByName("Acquire")
	if got := answerOf(acquire, errFrame); got != nil {
		t.Errorf("error frame: answer %v, want none", got)
	}
	if _, ok := answerOf(acquire, &lockdv1.StreamResponse{Body: &lockdv1.StreamResponse_Release{Release: &lockdv1.ReleaseResponse{}}}).(*lockdv1.AcquireResponse); ok {
		t.Error("a Release answer was taken for an Acquire's")
	}
}
