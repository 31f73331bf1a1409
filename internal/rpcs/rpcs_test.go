package rpcs

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestEveryMethodHasARow walks the generated service descriptors: a method
// added to the proto without a row here fails, as does a row whose fields
// the request does not have.
func TestEveryMethodHasARow(t *testing.T) {
	seen := map[string]bool{}
	svcs := lockdv1.File_lockd_v1_lockd_proto.Services()
	for i := range svcs.Len() {
		sd := svcs.Get(i)
		for j := range sd.Methods().Len() {
			md := sd.Methods().Get(j)
			name := "/" + string(sd.FullName()) + "/" + string(md.Name())
			seen[name] = true
			m := ByName(string(md.Name()))
			if m == nil || m.Procedure() != name {
				t.Errorf("%s: no row in rpcs.Methods", name)
				continue
			}
			in := md.Input()
			for _, f := range []protoreflect.Name{m.Dedup, m.Subject, m.Member} {
				if f != "" && in.Fields().ByName(f) == nil {
					t.Errorf("%s: %s has no field %q", name, in.FullName(), f)
				}
			}
			for _, f := range []protoreflect.Name{m.Subject, m.Member} {
				if f != "" && in.Fields().ByName(f).Kind() != protoreflect.StringKind {
					t.Errorf("%s: field %q is not a string", name, f)
				}
			}
			if (m.Retry == Dedup) != (m.Dedup != "") {
				t.Errorf("%s: Retry %d with Dedup field %q", name, m.Retry, m.Dedup)
			}
			if m.Retry == 0 {
				t.Errorf("%s: no retry class", name)
			}
		}
	}
	for _, m := range Methods {
		if m.StreamOnly {
			if m.Frame == "" || m.FrameRequest == "" || For(frameBody(t, m)) != m {
				t.Errorf("stream-only row %s: frame %q body %q", m.Name, m.Frame, m.FrameRequest)
			}
			continue
		}
		if !seen[m.Procedure()] {
			t.Errorf("row %s names no method of the proto", m.Procedure())
		}
	}
}

// frameBody returns an empty message of m's frame body.
func frameBody(t *testing.T, m *Method) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(m.FrameRequest)
	if err != nil {
		t.Fatalf("%s: %v", m.Name, err)
	}
	return mt.New().Interface()
}

// TestFramesMatchTheStream checks the frame kinds against the session
// stream's oneofs, both ways.
func TestFramesMatchTheStream(t *testing.T) {
	req := (&lockdv1.StreamRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("body").Fields()
	resp := (&lockdv1.StreamResponse{}).ProtoReflect().Descriptor().Fields()
	for i := range req.Len() {
		fd := req.Get(i)
		m := ByFrame(fd.Name())
		if m == nil {
			t.Errorf("StreamRequest.%s: no row carries it", fd.Name())
			continue
		}
		want := m.FrameRequest
		if want == "" {
			md := lockdv1.File_lockd_v1_lockd_proto.Services().ByName("LockService").Methods().ByName(protoreflect.Name(m.Name))
			want = md.Input().FullName()
		}
		if fd.Message().FullName() != want {
			t.Errorf("StreamRequest.%s carries %s, the row says %s", fd.Name(), fd.Message().FullName(), want)
		}
		if resp.ByName(fd.Name()) == nil {
			t.Errorf("StreamResponse has no %s answer", fd.Name())
		}
	}
	if len(Frames()) != req.Len() {
		t.Errorf("%d rows have a frame, the stream has %d kinds", len(Frames()), req.Len())
	}
}

func TestIdempotent(t *testing.T) {
	cases := []struct {
		msg  interface{ ProtoReflect() protoreflect.Message }
		want bool
	}{
		{&lockdv1.AcquireRequest{Name: "a"}, false},
		{&lockdv1.AcquireRequest{Name: "a", Seq: 3}, true},
		{&lockdv1.CreateSessionRequest{}, false},
		{&lockdv1.CreateSessionRequest{RequestId: "r"}, true},
		{&lockdv1.ClearMarkRequest{Name: "a"}, false},
		{&lockdv1.ClearMarkRequest{Name: "a", Token: 9}, true},
		{&lockdv1.KeepAliveRequest{}, true},
		{&lockdv1.KeepAliveBatch{}, true},
		{&lockdv1.ForceReleaseRequest{Name: "a"}, false},
		{&lockdv1.TransferLeadershipRequest{}, false},
		{&lockdv1.RemoveMemberRequest{}, true},
		{&lockdv1.SubscribeNoticesRequest{}, true},
	}
	for _, c := range cases {
		m := For(c.msg)
		if m == nil {
			t.Fatalf("%T: no row", c.msg)
		}
		if got := m.Idempotent(c.msg); got != c.want {
			t.Errorf("%T %v: idempotent %v, want %v", c.msg, c.msg, got, c.want)
		}
	}
}

func TestWrapUnwrap(t *testing.T) {
	m := ByName("Complete")
	in := &lockdv1.CompleteRequest{Name: "job", Seq: 2}
	got, body := FrameOf(m.Wrap(in))
	if got != m || body != in {
		t.Fatalf("FrameOf(Wrap) = %v, %v", got, body)
	}
	if m.SubjectOf(in) != "job" {
		t.Errorf("subject %q", m.SubjectOf(in))
	}
	resp := &lockdv1.StreamResponse{}
	out := &lockdv1.CompleteResponse{}
	m.SetAnswer(resp, out)
	if m.Unwrap(resp) != out || ByName("Acquire").Unwrap(resp) != nil {
		t.Errorf("Unwrap: %v", resp)
	}
	if m, body := FrameOf(&lockdv1.StreamRequest{}); m != nil || body != nil {
		t.Errorf("empty frame: %v %v", m, body)
	}
}

// BenchmarkAccess is what the server's permission check and the client's
// policy read per call: the row, the lock name, the retry class.
func BenchmarkAccess(b *testing.B) {
	msg := &lockdv1.AcquireRequest{Name: "invoices/2025", Seq: 7}
	for b.Loop() {
		m := For(msg)
		if m.SubjectOf(msg) == "" || !m.Idempotent(msg) {
			b.Fatal("bad row")
		}
	}
}

// BenchmarkFrame is what a stream frame costs both sides in the table's
// reflection: wrap, dispatch, answer, unwrap.
func BenchmarkFrame(b *testing.B) {
	m := ByName("Acquire")
	in := &lockdv1.AcquireRequest{Name: "invoices/2025", Seq: 7}
	out := &lockdv1.AcquireResponse{}
	for b.Loop() {
		got, body := FrameOf(m.Wrap(in))
		resp := &lockdv1.StreamResponse{}
		got.SetAnswer(resp, out)
		if body != in || m.Unwrap(resp) != out {
			b.Fatal("bad frame")
		}
	}
}
