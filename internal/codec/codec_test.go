package codec

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// samples are messages of the hot path and of the other shapes the API
// has (optional fields, oneofs, nested and repeated messages, bytes).
func samples() []proto.Message {
	limit := uint32(3)
	return []proto.Message{
		&lockdv1.AcquireRequest{SessionId: "s1", Secret: strings.Repeat("ab", 32), Seq: 7, Ack: 6, Name: "jobs/nightly", Mode: lockdv1.Mode_MODE_SHARED, Limit: &limit, Wait: true, Value: []byte{0, 0xff, 1}, PollTimeout: durationpb.New(25e9)},
		&lockdv1.AcquireResponse{Status: lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, Token: 1 << 40},
		&lockdv1.ReleaseRequest{SessionId: "s1", Seq: 8, Ack: 8, Name: "x", Token: 9},
		&lockdv1.StreamRequest{CallId: 3, Body: &lockdv1.StreamRequest_Release{Release: &lockdv1.ReleaseRequest{Name: "é", Seq: 1}}},
		&lockdv1.StreamResponse{CallId: 3, ClusterId: "c", Body: &lockdv1.StreamResponse_Acquire{Acquire: &lockdv1.AcquireResponse{Token: 2}}},
		&lockdv1.StreamResponse{CallId: 4, Body: &lockdv1.StreamResponse_Error{Error: &lockdv1.StreamError{Code: 9, Message: "no"}}},
		&lockdv1.StreamRequest{},
		&lockdv1.StatusResponse{},
	}
}

// TestSameBytesAsProtobuf: the codec writes what protobuf-go writes and
// reads it back to an equal message, replacing what the message held.
func TestSameBytesAsProtobuf(t *testing.T) {
	var c Codec
	for _, m := range samples() {
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.MarshalAppend([]byte("prefix"), m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !bytes.Equal(got[:6], []byte("prefix")) || !bytes.Equal(got[6:], want) {
			t.Errorf("%T: %x, want %x", m, got[6:], want)
		}
		back := m.ProtoReflect().New().Interface()
		if err := c.Unmarshal(want, back); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !proto.Equal(back, m) {
			t.Errorf("%T: read back %v, want %v", m, back, m)
		}
	}
	// Unmarshal replaces, as proto.Unmarshal does.
	old := &lockdv1.AcquireRequest{Name: "old", Wait: true}
	data, _ := proto.Marshal(&lockdv1.AcquireRequest{Seq: 5})
	if err := c.Unmarshal(data, old); err != nil || old.GetName() != "" || old.GetWait() || old.GetSeq() != 5 {
		t.Errorf("unmarshal over a used message: %v, err %v", old, err)
	}
}

// TestRefusesWhatProtobufRefuses: a string that is not UTF-8 and a
// truncated message are refused, and a bytes field that is not UTF-8 is
// read.
func TestRefusesWhatProtobufRefuses(t *testing.T) {
	var c Codec
	bad, err := proto.Marshal(&lockdv1.ReleaseRequest{Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	bad = append(bad, 0x22, 2, 0xff, 0xfe) // name (field 4) = "\xff\xfe"
	if err := c.Unmarshal(bad, &lockdv1.ReleaseRequest{}); err == nil {
		t.Error("a name that is not UTF-8 was read")
	}
	full, _ := proto.Marshal(&lockdv1.ReleaseRequest{Name: "abc", Seq: 1})
	if err := c.Unmarshal(full[:len(full)-1], &lockdv1.ReleaseRequest{}); err == nil {
		t.Error("a truncated message was read")
	}
	val, _ := proto.Marshal(&lockdv1.AcquireRequest{Name: "n", Value: []byte{0xff, 0xfe}})
	var got lockdv1.AcquireRequest
	if err := c.Unmarshal(val, &got); err != nil || !bytes.Equal(got.GetValue(), []byte{0xff, 0xfe}) {
		t.Errorf("binary value: %v, err %v", got.GetValue(), err)
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Error("a string was marshalled")
	}
}

// BenchmarkCodec compares the codec with protobuf-go on an Acquire frame
// and its answer, one encode and one decode each.
func BenchmarkCodec(b *testing.B) {
	req := samples()[3]
	resp := samples()[4]
	reqData, _ := proto.Marshal(req)
	buf := make([]byte, 0, 256)
	b.Run("vtproto", func(b *testing.B) {
		var c Codec
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = c.MarshalAppend(buf[:0], req)
			_ = c.Unmarshal(reqData, &lockdv1.StreamRequest{})
			buf, _ = c.MarshalAppend(buf[:0], resp)
		}
	})
	b.Run("protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], req)
			_ = proto.Unmarshal(reqData, &lockdv1.StreamRequest{})
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], resp)
		}
	})
}

// TestUTF8Check: the generated code reads every sample (the check vouches
// for them, varints and binary bytes fields included), and a string that
// is not UTF-8, nested in a frame's oneof, is refused as protobuf-go
// refuses it.
func TestUTF8Check(t *testing.T) {
	for _, m := range samples() {
		data, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !validUTF8(data, tableOf(m.ProtoReflect().Descriptor())) {
			t.Errorf("%T: not taken by the generated code: %x", m, data)
		}
	}
	var inner []byte
	inner = protowire.AppendTag(inner, 2, protowire.VarintType)
	inner = protowire.AppendVarint(inner, 300)
	inner = protowire.AppendTag(inner, 4, protowire.BytesType)
	inner = protowire.AppendBytes(inner, []byte{'a', 0xc3}) // cut short
	var frame []byte
	frame = protowire.AppendTag(frame, 1, protowire.VarintType)
	frame = protowire.AppendVarint(frame, 1<<40)
	frame = protowire.AppendTag(frame, 5, protowire.BytesType) // release
	frame = protowire.AppendBytes(frame, inner)
	if validUTF8(frame, tableOf((&lockdv1.StreamRequest{}).ProtoReflect().Descriptor())) {
		t.Error("a release frame whose name is not UTF-8 passed the check")
	}
	var c Codec
	err := c.Unmarshal(frame, &lockdv1.StreamRequest{})
	want := proto.Unmarshal(frame, &lockdv1.StreamRequest{})
	if err == nil || want == nil {
		t.Errorf("bad name in a frame: codec %v, protobuf-go %v; want both refused", err, want)
	}
}
