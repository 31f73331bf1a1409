// Package rpcs is the one table of per-method facts of the lockd API: for
// each RPC, whether a resend after an unknown outcome is safe, the
// permission it needs, which request field names the lock (or prefix, or
// member) it concerns, and the session-stream frame that may carry it.
//
// Both sides read it: the Go client's retry policy and stream framing, the
// server's permission check, audit and stream dispatch. It is a leaf (it
// imports only the generated messages), so the server never imports client
// code. A test walks every method of the generated service descriptors and
// fails when one has no row here.
package rpcs

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Retry says when a request may be resent after an attempt whose outcome
// is unknown (the connection broke, the attempt timed out, the leader lost
// leadership before the entry committed).
type Retry uint8

const (
	// Always: a read, or a mutation that is the same whenever it is
	// applied again (a keepalive, removing a removed member).
	Always Retry = iota + 1
	// Dedup: the server deduplicates the request when its Dedup field is
	// set (a sequence number, a request id, a mark's token); unset, the
	// request is resent only when the server surely did not take it.
	Dedup
	// Never: a second one would act again (ForceRelease could expire a
	// session that took the lock since; TransferLeadership would move
	// leadership again).
	Never
)

// StreamUpgrade is the HTTP/1.1 Upgrade token of a session stream served
// on its own upgraded connection instead of an HTTP/2 stream: after "101
// Switching Protocols" the connection carries the stream's Connect
// envelopes both ways (docs/protocol.md).
const StreamUpgrade = "lockd-stream"

// Perm is the permission a call needs (the server maps it to its auth
// file's grants).
type Perm uint8

const (
	// Open: any caller with valid credentials (Status).
	Open Perm = iota
	// Read on the lock name or prefix in the Subject field.
	Read
	// Lock on the name in the Subject field; with AnyName, any lock grant.
	Lock
	// Admin: force-release, marks, membership, snapshots. Audited whatever
	// the outcome.
	Admin
)

// Method is one RPC's row, or one stream-only call's.
type Method struct {
	// Service and Name name the procedure: /Service/Name. A StreamOnly
	// row names no procedure of the proto: Name is the call's name in
	// metrics and the audit log, Service the service whose stream carries
	// it.
	Service, Name string
	// StreamOnly: the call exists only as a session-stream frame (no unary
	// RPC); Frame and FrameRequest say which.
	StreamOnly bool
	// Retry is when a resend after an unknown outcome is safe; Dedup names
	// the request field that makes it safe under Retry == Dedup.
	Retry Retry
	Dedup protoreflect.Name
	// Perm is the permission needed, on the name in Subject; AnyName says
	// any grant of Perm will do (the session calls, which name no lock).
	Perm    Perm
	AnyName bool
	// Subject is the request field naming the lock or prefix ("" when none:
	// the check is then on every name), Member the one naming the cluster
	// member concerned (for the audit log).
	Subject, Member protoreflect.Name
	// Frame is the session-stream frame kind that carries the request (the
	// StreamRequest and StreamResponse oneof field), "" when the method is
	// unary only. FrameRequest is the frame's body when it is not the
	// method's request (KeepAlive frames carry a KeepAliveBatch).
	Frame        protoreflect.Name
	FrameRequest protoreflect.FullName

	// The frame's StreamRequest and StreamResponse fields, resolved once.
	reqField, respField protoreflect.FieldDescriptor
}

// Procedure returns the method's Connect procedure, /Service/Name (for a
// StreamOnly row, a name no server routes).
func (m *Method) Procedure() string { return "/" + m.Service + "/" + m.Name }

const (
	lockService    = "lockd.v1.LockService"
	clusterService = "lockd.v1.ClusterService"
	sessionService = "lockd.v1.SessionService"
	watchService   = "lockd.v1.WatchService"
)

// Methods is the table, one row per RPC.
var Methods = []*Method{
	{Service: lockService, Name: "CreateSession", Retry: Dedup, Dedup: "request_id", Perm: Lock, AnyName: true, Frame: "create_session"},
	{Service: lockService, Name: "KeepAlive", Retry: Always, Perm: Lock, AnyName: true, Frame: "keep_alive", FrameRequest: "lockd.v1.KeepAliveBatch"},
	{Service: lockService, Name: "CloseSession", Retry: Dedup, Dedup: "seq", Perm: Lock, AnyName: true, Frame: "close_session"},
	// Sessions of every prefix: read on every name.
	{Service: lockService, Name: "ListSessions", Retry: Always, Perm: Read},
	{Service: lockService, Name: "Acquire", Retry: Dedup, Dedup: "seq", Perm: Lock, Subject: "name", Frame: "acquire"},
	{Service: lockService, Name: "Release", Retry: Dedup, Dedup: "seq", Perm: Lock, Subject: "name", Frame: "release"},
	{Service: lockService, Name: "Cancel", Retry: Dedup, Dedup: "seq", Perm: Lock, Subject: "name", Frame: "cancel"},
	{Service: lockService, Name: "CheckToken", Retry: Always, Perm: Read, Subject: "name"},
	{Service: lockService, Name: "DescribeLock", Retry: Always, Perm: Read, Subject: "name"},
	{Service: lockService, Name: "ListLocks", Retry: Always, Perm: Read, Subject: "prefix"},
	{Service: lockService, Name: "ForceRelease", Retry: Never, Perm: Admin, Subject: "name"},
	{Service: lockService, Name: "Status", Retry: Always, Perm: Open},
	{Service: lockService, Name: "Complete", Retry: Dedup, Dedup: "seq", Perm: Lock, Subject: "name", Frame: "complete"},
	// Without the mark's token, a resend could clear a mark set since (the
	// job's next run).
	{Service: lockService, Name: "ClearMark", Retry: Dedup, Dedup: "token", Perm: Admin, Subject: "name"},
	{Service: lockService, Name: "SetValue", Retry: Dedup, Dedup: "seq", Perm: Lock, Subject: "name"},
	// Setting the same policy again changes nothing.
	{Service: lockService, Name: "SetLockPolicy", Retry: Always, Perm: Admin, Subject: "name"},
	// Never: a request asks the holds there when it applies, and an
	// admin's starts their revoke grace; a retry after an unknown outcome
	// could ask (and revoke) a newer holder nobody meant.
	{Service: lockService, Name: "RequestRelease", Retry: Never, Perm: Lock, Subject: "name"},
	{Service: lockService, Name: "Explain", Retry: Always, Perm: Read, Subject: "name"},
	// Several names: any lock grant passes here, and the handler checks
	// each name (Guard.CheckLock).
	{Service: lockService, Name: "AcquireMany", Retry: Dedup, Dedup: "seq", Perm: Lock, AnyName: true},
	{Service: clusterService, Name: "Join", Retry: Always, Perm: Admin, Member: "node_id"},
	{Service: clusterService, Name: "RemoveMember", Retry: Always, Perm: Admin, Member: "node_id"},
	{Service: clusterService, Name: "TransferLeadership", Retry: Never, Perm: Admin, Member: "node_id"},
	// The stream carries the calls above; each frame is checked as its own
	// method, the stream itself only needs valid credentials.
	{Service: sessionService, Name: "Stream", Retry: Never, Perm: Open},
	// Stream-only: the stream delivers the session's notices after it
	// (the session's secret is checked as KeepAlive's is).
	{Service: sessionService, Name: "SubscribeNotices", StreamOnly: true, Retry: Always, Perm: Lock, AnyName: true,
		Frame: "subscribe_notices", FrameRequest: "lockd.v1.SubscribeNoticesRequest"},
	{Service: watchService, Name: "Watch", Retry: Always, Perm: Read, Subject: "prefix"},
}

var (
	streamRequest  = (&lockdv1.StreamRequest{}).ProtoReflect().Descriptor()
	streamResponse = (&lockdv1.StreamResponse{}).ProtoReflect().Descriptor()
	streamBody     = streamRequest.Oneofs().ByName("body")
	byRequest      = map[protoreflect.FullName]*Method{}
	byFrame        = map[protoreflect.Name]*Method{}
	byName         = map[string]*Method{}
	frames         []*Method
)

func init() {
	for _, m := range Methods {
		byName[m.Name] = m
		sd := lockdv1.File_lockd_v1_lockd_proto.Services().ByName(protoreflect.Name(m.Service[len("lockd.v1."):]))
		switch {
		case m.StreamOnly:
			if sd == nil || m.Frame == "" || m.FrameRequest == "" || sd.Methods().ByName(protoreflect.Name(m.Name)) != nil {
				panic("rpcs: stream-only row " + m.Name + " needs a service, a frame and its body, and no RPC of its name")
			}
		case sd == nil || sd.Methods().ByName(protoreflect.Name(m.Name)) == nil:
			panic("rpcs: table names an unknown method " + m.Procedure())
		default:
			if md := sd.Methods().ByName(protoreflect.Name(m.Name)); !md.IsStreamingClient() {
				byRequest[md.Input().FullName()] = m
			}
		}
		if m.Frame != "" {
			m.reqField = streamRequest.Fields().ByName(m.Frame)
			m.respField = streamResponse.Fields().ByName(m.Frame)
			byFrame[m.Frame] = m
			frames = append(frames, m)
			if m.FrameRequest != "" {
				byRequest[m.FrameRequest] = m
			}
		}
	}
}

// ByName returns the row of the method called name, or nil.
func ByName(name string) *Method { return byName[name] }

// For returns the row of the method whose request (or stream frame body)
// msg is, or nil.
func For(msg proto.Message) *Method {
	if msg == nil {
		return nil
	}
	return byRequest[msg.ProtoReflect().Descriptor().FullName()]
}

// ByFrame returns the row of the method a stream frame kind carries, or
// nil.
func ByFrame(kind protoreflect.Name) *Method { return byFrame[kind] }

// Frames returns the rows of the methods a session stream carries, in
// table order.
func Frames() []*Method { return frames }

// Idempotent reports whether msg, a request of m, may be resent after an
// unknown outcome.
func (m *Method) Idempotent(msg proto.Message) bool {
	switch m.Retry {
	case Always:
		return true
	case Dedup:
		r := msg.ProtoReflect()
		return r.Has(r.Descriptor().Fields().ByName(m.Dedup))
	}
	return false
}

// SubjectOf returns the lock name or prefix msg, a request of m, names, or
// "".
func (m *Method) SubjectOf(msg proto.Message) string { return stringField(msg, m.Subject) }

// MemberOf returns the cluster member msg, a request of m, concerns, or "".
func (m *Method) MemberOf(msg proto.Message) string { return stringField(msg, m.Member) }

func stringField(msg proto.Message, name protoreflect.Name) string {
	if name == "" || msg == nil {
		return ""
	}
	r := msg.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(name)
	if fd == nil {
		return ""
	}
	return r.Get(fd).String()
}

// Wrap puts msg, a request of m, in a stream frame. m must have a Frame.
func (m *Method) Wrap(msg proto.Message) *lockdv1.StreamRequest {
	req := &lockdv1.StreamRequest{}
	req.ProtoReflect().Set(m.reqField, protoreflect.ValueOfMessage(msg.ProtoReflect()))
	return req
}

// Unwrap returns the answer of m's kind in a stream frame, or nil when the
// frame holds another kind of answer.
func (m *Method) Unwrap(resp *lockdv1.StreamResponse) proto.Message {
	r := resp.ProtoReflect()
	if m.respField == nil || !r.Has(m.respField) {
		return nil
	}
	return r.Get(m.respField).Message().Interface()
}

// FrameOf returns the row of the method a stream request carries and its
// body, or nil and nil when the frame has no (known) body.
func FrameOf(req *lockdv1.StreamRequest) (*Method, proto.Message) {
	r := req.ProtoReflect()
	fd := r.WhichOneof(streamBody)
	if fd == nil {
		return nil, nil
	}
	m := byFrame[fd.Name()]
	if m == nil {
		return nil, nil
	}
	return m, r.Get(fd).Message().Interface()
}

// SetAnswer puts out, the answer of m's kind, in a stream response.
func (m *Method) SetAnswer(resp *lockdv1.StreamResponse, out proto.Message) {
	resp.ProtoReflect().Set(m.respField, protoreflect.ValueOfMessage(out.ProtoReflect()))
}
