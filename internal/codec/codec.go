// Package codec is the binary protobuf codec of lockd's Connect clients
// and handlers: the same wire format as Connect's default "proto" codec,
// encoded and decoded by the code protoc-gen-go-vtproto generates for the
// API's messages (MarshalVT, UnmarshalVT) instead of protobuf-go's
// table-driven reflection, so a call spends less CPU and allocates less on
// both sides. Messages without generated code (gRPC health, reflection)
// go through protobuf-go as before.
//
// It is a leaf package (it imports no client, server or Connect code), so
// the client (package lockd) and the server register the same codec
// (connect.WithCodec(Codec{})), and the state machine decodes its log
// entries with UnmarshalExact.
//
// The generated code decodes only on 64-bit platforms: it gathers varints
// in an int, so on a 32-bit one it would, for one, read a bool whose only
// set bits are at 32 or above as false, where protobuf-go reads true.
// Elsewhere protobuf-go decodes everything.
package codec

import (
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"
)

// generated reports whether the generated code may decode here (a 64-bit
// platform; see the package comment). A constant: the check costs nothing.
const generated = strconv.IntSize == 64

// vouched reports whether the generated code may decode data into m: on
// this platform, and data holds nothing it would read otherwise than
// protobuf-go (validUTF8).
func vouched(data []byte, m Message) bool {
	return generated && validUTF8(data, tableOf(m.ProtoReflect().Descriptor()))
}

// Message is a message with generated code (protoc-gen-go-vtproto).
// lockd's API messages and its state machine's log commands are.
type Message interface {
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
	UnmarshalVT(dAtA []byte) error
	Reset()
	proto.Message
}

// Codec is the "proto" codec with generated marshalling; the zero value
// is ready. It implements connect.Codec and the appending form Connect
// uses with its pooled buffers.
type Codec struct{}

// Name is "proto": Codec replaces Connect's default binary codec.
func (Codec) Name() string { return "proto" }

// Marshal encodes message.
func (c Codec) Marshal(message any) ([]byte, error) { return c.MarshalAppend(nil, message) }

// MarshalAppend appends the encoding of message to dst (Connect passes a
// pooled buffer).
func (Codec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	switch m := message.(type) {
	case Message:
		// protobuf-go refuses to encode a string field that is not
		// UTF-8 and the generated code does not check: output it cannot
		// vouch for is encoded again by protobuf-go, which says why not.
		l := len(dst)
		out, err := Append(dst, m)
		if err != nil || validUTF8(out[l:], tableOf(m.ProtoReflect().Descriptor())) {
			return out, err
		}
		return proto.MarshalOptions{}.MarshalAppend(out[:l], m)
	case proto.Message:
		return proto.MarshalOptions{}.MarshalAppend(dst, m)
	}
	return nil, errNotProto(message)
}

// Append appends m's encoding, by its generated code, to dst.
func Append(dst []byte, m interface {
	SizeVT() int
	MarshalToSizedBufferVT(dAtA []byte) (int, error)
}) ([]byte, error) {
	n := m.SizeVT()
	l := len(dst)
	if cap(dst)-l < n {
		grown := make([]byte, l, l+n)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:l+n]
	if _, err := m.MarshalToSizedBufferVT(dst[l:]); err != nil {
		return nil, fmt.Errorf("marshal %T: %w", m, err)
	}
	return dst, nil
}

// Unmarshal decodes data into message, replacing its contents, as
// proto.Unmarshal does. protobuf-go refuses a string field that is not
// valid UTF-8 and the generated code does not check: input with such a
// field (validUTF8) is decoded by protobuf-go, so what is refused stays
// the same.
func (Codec) Unmarshal(data []byte, message any) error {
	if m, ok := message.(Message); ok && vouched(data, m) {
		m.Reset()
		if err := m.UnmarshalVT(data); err != nil {
			return fmt.Errorf("unmarshal into %T: %w", message, err)
		}
		return nil
	}
	pm, ok := message.(proto.Message)
	if !ok {
		return errNotProto(message)
	}
	if err := proto.Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", message, err)
	}
	return nil
}

// UnmarshalExact decodes data into m as proto.Unmarshal does: the same
// message (proto.Equal), or an error where protobuf-go gives one. The
// generated code decodes what validUTF8 vouches for; protobuf-go decodes
// everything else, and again whatever the generated code refuses, so an
// error is always protobuf-go's own, in the same words within one binary
// (protobuf-go varies its "proto:" prefix's space from build to build on
// purpose). One difference proto.Equal does not see: a bytes field present
// with no bytes reads as an empty slice, where protobuf-go leaves nil;
// neither encoder writes such a field, and no reader of these messages may
// tell nil from empty. The state machine decodes its log entries with it:
// nodes of different builds must read an entry the same.
func UnmarshalExact(data []byte, m Message) error {
	if vouched(data, m) {
		m.Reset()
		if m.UnmarshalVT(data) == nil {
			return nil
		}
	}
	return proto.Unmarshal(data, m)
}

// MarshalStable encodes message deterministically (Connect uses it for
// GET requests of idempotent methods).
func (Codec) MarshalStable(message any) ([]byte, error) {
	pm, ok := message.(proto.Message)
	if !ok {
		return nil, errNotProto(message)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pm)
}

// IsBinary reports that the encoding is binary.
func (Codec) IsBinary() bool { return true }

func errNotProto(m any) error { return fmt.Errorf("%T is not a protobuf message", m) }
