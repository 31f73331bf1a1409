package codec

import (
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// sameAsProtobuf decodes data with the codec and with protobuf-go into
// fresh messages of m's type and reports how they differ ("" if not):
// one refused and not the other, or different messages (unknown fields
// included, which proto.Equal compares).
func sameAsProtobuf(data []byte, m proto.Message) string {
	got, want := m.ProtoReflect().New().Interface(), m.ProtoReflect().New().Interface()
	gerr := Codec{}.Unmarshal(data, got)
	werr := proto.Unmarshal(data, want)
	switch {
	case (gerr == nil) != (werr == nil):
		return "codec: " + errString(gerr) + "; protobuf-go: " + errString(werr)
	case gerr == nil && !proto.Equal(got, want):
		return "codec read " + got.(interface{ String() string }).String() + "; protobuf-go " + want.(interface{ String() string }).String()
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return "accepted"
	}
	return err.Error()
}

// TestWrongWireTypeAsProtobuf: protobuf-go keeps a known field that comes
// with another wire type than its own as an unknown field; the codec must
// read such input the same (the generated code alone refuses it).
func TestWrongWireTypeAsProtobuf(t *testing.T) {
	cases := []struct {
		name string
		m    proto.Message
		data []byte
	}{
		{"string as varint", &lockdv1.ReleaseRequest{},
			protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 7)},
		{"varint as bytes", &lockdv1.ReleaseRequest{},
			protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), []byte("x"))},
		{"message as fixed32", &lockdv1.StreamRequest{},
			protowire.AppendFixed32(protowire.AppendTag(nil, 5, protowire.Fixed32Type), 1)},
		{"nested string as fixed64", &lockdv1.StreamRequest{},
			protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType),
				protowire.AppendFixed64(protowire.AppendTag(nil, 4, protowire.Fixed64Type), 1))},
		{"unknown field in a Duration", &lockdv1.AcquireRequest{},
			protowire.AppendBytes(protowire.AppendTag(nil, 8, protowire.BytesType),
				protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 25))},
		{"field number above the largest", &lockdv1.AcquireResponse{},
			protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1)},
		{"unknown field with a tag not in its shortest form", &lockdv1.AcquireResponse{},
			[]byte{0x80, 0x80, 0x88, 0x80, 0x00, 0x20}},
	}
	for _, c := range cases {
		if d := sameAsProtobuf(c.data, c.m); d != "" {
			t.Errorf("%s: %s", c.name, d)
		}
	}
}

// TestMutationsAsProtobuf: byte mutations of the samples are read (or
// refused) by the codec exactly as protobuf-go reads them.
func TestMutationsAsProtobuf(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	more := []proto.Message{
		&lockdv1.ListSessionsResponse{Sessions: []*lockdv1.SessionInfo{{SessionId: "a", Owner: "o", Ttl: durationpb.New(3e9), CreatedAt: timestamppb.New(time.Unix(5, 6)), Holding: []string{"x", "y"}, Waiting: []string{"z"}}}},
		&lockdv1.DescribeLockResponse{Lock: &lockdv1.LockInfo{Name: "n", Holders: []*lockdv1.Holder{{SessionId: "s", Token: 4, Value: []byte{0xff}, Owner: "w"}}, LockDelay: durationpb.New(1e9)}},
		&lockdv1.StreamRequest{CallId: 9, Body: &lockdv1.StreamRequest_KeepAlive{KeepAlive: &lockdv1.KeepAliveBatch{Sessions: []*lockdv1.KeepAliveRequest{{SessionId: "a", Secret: "b"}, {SessionId: "c"}}}}},
	}
	for _, m := range append(samples(), more...) {
		base, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(base) == 0 {
			continue
		}
		for range 5000 {
			data := mutate(r, base)
			if d := sameAsProtobuf(data, m); d != "" {
				t.Errorf("%T %x: %s", m, data, d)
			}
		}
	}
}

// TestMarshalRefusesWhatProtobufRefuses: a string field that is not UTF-8,
// nested or not, is not encoded, as protobuf-go does not encode it.
func TestMarshalRefusesWhatProtobufRefuses(t *testing.T) {
	for _, m := range []proto.Message{
		&lockdv1.ReleaseRequest{Name: "\xff"},
		&lockdv1.StreamResponse{Body: &lockdv1.StreamResponse_Error{Error: &lockdv1.StreamError{Message: "a\xc3"}}},
		&lockdv1.KeepAliveBatch{Sessions: []*lockdv1.KeepAliveRequest{{SessionId: "ok"}, {SessionId: "\xfe"}}},
	} {
		_, werr := proto.Marshal(m)
		_, gerr := Codec{}.Marshal(m)
		if (gerr == nil) != (werr == nil) {
			t.Errorf("%T: codec %s; protobuf-go %s", m, errString(gerr), errString(werr))
		}
	}
}

// mutate returns a copy of base with one to three random changes: a byte
// replaced, a bit flipped, a byte removed or a byte inserted.
func mutate(r *rand.Rand, base []byte) []byte {
	data := append([]byte(nil), base...)
	for range 1 + r.IntN(3) {
		if len(data) == 0 {
			break
		}
		i := r.IntN(len(data))
		switch r.IntN(4) {
		case 0:
			data[i] = byte(r.IntN(256))
		case 1:
			data[i] ^= 1 << r.IntN(8)
		case 2:
			data = append(data[:i], data[i+1:]...)
		default:
			data = append(data[:i], append([]byte{byte(r.IntN(256))}, data[i:]...)...)
		}
	}
	return data
}
