package wire

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// A method's row facts read from a request (is it deduplicated, which lock
// it names) and the stream frame that carries it, without protobuf
// reflection on the call path: the table (internal/rpcs) is the one source
// of the facts, and these functions are resolved from it once per method,
// with the reflective reading kept for a field no fast path covers.

type seqGetter interface{ GetSeq() uint64 }

type nameGetter interface{ GetName() string }

// readersOf returns how a request of m is read: whether it may be resent
// after an unknown outcome (rpcs.Method.Idempotent) and the lock it names
// for error messages ("" unless the row's subject is the name).
func readersOf[Req any](m *rpcs.Method) (idem func(*Req) bool, subject func(*Req) string) {
	var zero *Req
	switch m.Retry {
	case rpcs.Always:
		idem = func(*Req) bool { return true }
	case rpcs.Dedup:
		fd := any(zero).(proto.Message).ProtoReflect().Descriptor().Fields().ByName(m.Dedup)
		if _, ok := any(zero).(seqGetter); ok && m.Dedup == "seq" && fd != nil && !fd.HasPresence() && fd.Kind() == protoreflect.Uint64Kind {
			// An implicit-presence uint64 is present when not zero.
			idem = func(r *Req) bool { return any(r).(seqGetter).GetSeq() != 0 }
		} else {
			idem = func(r *Req) bool { return m.Idempotent(any(r).(proto.Message)) }
		}
	default:
		idem = func(*Req) bool { return false }
	}
	subject = func(*Req) string { return "" }
	if m.Subject == "name" {
		if _, ok := any(zero).(nameGetter); ok {
			subject = func(r *Req) string { return any(r).(nameGetter).GetName() }
		} else {
			subject = func(r *Req) string { return m.SubjectOf(any(r).(proto.Message)) }
		}
	}
	return idem, subject
}

// wrapFrame puts msg, a request of m, in a stream frame (rpcs.Method.Wrap
// without reflection for the kinds the client streams).
func wrapFrame(m *rpcs.Method, msg proto.Message) *lockdv1.StreamRequest {
	switch b := msg.(type) {
	case *lockdv1.AcquireRequest:
		return &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Acquire{Acquire: b}}
	case *lockdv1.ReleaseRequest:
		return &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Release{Release: b}}
	case *lockdv1.CancelRequest:
		return &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Cancel{Cancel: b}}
	case *lockdv1.CompleteRequest:
		return &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_Complete{Complete: b}}
	case *lockdv1.CreateSessionRequest:
		return &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_CreateSession{CreateSession: b}}
	case *lockdv1.CloseSessionRequest:
		return &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_CloseSession{CloseSession: b}}
	case *lockdv1.SubscribeNoticesRequest:
		return &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_SubscribeNotices{SubscribeNotices: b}}
	}
	return m.Wrap(msg)
}

// answerOf returns the answer of m's kind a stream frame carries, or nil
// for an error frame, none, or another kind (rpcs.Method.Unwrap, without
// reflection for the kinds the client streams; a kind added to the table
// and not here is read by the table's reflection).
func answerOf(m *rpcs.Method, r *lockdv1.StreamResponse) any {
	switch b := r.GetBody().(type) {
	case *lockdv1.StreamResponse_Acquire:
		return b.Acquire
	case *lockdv1.StreamResponse_Release:
		return b.Release
	case *lockdv1.StreamResponse_Cancel:
		return b.Cancel
	case *lockdv1.StreamResponse_Complete:
		return b.Complete
	case *lockdv1.StreamResponse_CreateSession:
		return b.CreateSession
	case *lockdv1.StreamResponse_CloseSession:
		return b.CloseSession
	case *lockdv1.StreamResponse_KeepAlive:
		return b.KeepAlive
	case *lockdv1.StreamResponse_SubscribeNotices:
		return b.SubscribeNotices
	case *lockdv1.StreamResponse_Error, nil:
		return nil
	}
	if msg := m.Unwrap(r); msg != nil {
		return msg
	}
	return nil
}
