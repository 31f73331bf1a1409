package codec

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// fsmSamples returns one message of every type of the state machine's
// log commands and snapshots, every field set (strings, bytes, optional,
// repeated and nested fields alike), so the mutations below reach them
// all.
func fsmSamples(t *testing.T) []Message {
	var out []Message
	msgs := fsmv1.File_lockd_fsm_v1_fsm_proto.Messages()
	for i := range msgs.Len() {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(msgs.Get(i).FullName())
		if err != nil {
			t.Fatal(err)
		}
		m, ok := mt.New().Interface().(Message)
		if !ok {
			t.Fatalf("%s has no generated code", msgs.Get(i).FullName())
		}
		fill(m.ProtoReflect(), 0)
		out = append(out, m)
	}
	return out
}

// fill sets every field of m: two elements in a repeated field, nested
// messages two levels deep.
func fill(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.Kind() == protoreflect.MessageKind && depth >= 2:
		case fd.IsList():
			l := m.Mutable(fd).List()
			for j := range 2 {
				if fd.Kind() == protoreflect.MessageKind {
					e := l.NewElement()
					fill(e.Message(), depth+1)
					l.Append(e)
				} else {
					l.Append(scalar(fd, j))
				}
			}
		case fd.IsMap():
		case fd.Kind() == protoreflect.MessageKind:
			fill(m.Mutable(fd).Message(), depth+1)
		default:
			m.Set(fd, scalar(fd, 1))
		}
	}
}

// scalar returns a value of fd's kind, not its zero value.
func scalar(fd protoreflect.FieldDescriptor, j int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString([]string{"é-a", "jobs/b"}[j])
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(j), 0xff})
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(j + 1))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(300 + j))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(1<<40) + int64(j))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(300 + j))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(1<<40) + uint64(j))
	}
	panic("fill: no value for kind " + fd.Kind().String())
}

// exactAsProtobuf decodes data with UnmarshalExact and with protobuf-go
// into fresh messages of m's type and reports how they differ ("" if
// not): another error text, or different messages (unknown fields
// included).
func exactAsProtobuf(data []byte, m Message) string {
	got, want := m.ProtoReflect().New().Interface().(Message), m.ProtoReflect().New().Interface()
	gerr := UnmarshalExact(data, got)
	werr := proto.Unmarshal(data, want)
	switch {
	case errString(gerr) != errString(werr):
		return "exact: " + errString(gerr) + "; protobuf-go: " + errString(werr)
	case gerr == nil && !proto.Equal(got, want):
		return "exact read " + got.(interface{ String() string }).String() + "; protobuf-go " + want.(interface{ String() string }).String()
	}
	return ""
}

// TestExactAsProtobuf: every log command and snapshot message, whole and
// under byte mutations (a changed, flipped, dropped or added byte, up to
// three at once; a string that is not UTF-8 among them), is read by
// UnmarshalExact exactly as protobuf-go reads it: the same message, or
// the same error, word for word. Every node must read a log entry the
// same, whatever its build.
func TestExactAsProtobuf(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	samples := fsmSamples(t)
	if len(samples) < 30 {
		t.Fatalf("only %d fsm messages found", len(samples))
	}
	samples = append(samples, &lockdv1.AcquireRequest{SessionId: "s", Name: "n", Value: []byte{1}})
	for _, m := range samples {
		base, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if d := exactAsProtobuf(base, m); d != "" {
			t.Errorf("%T whole: %s", m, d)
		}
		for range 3000 {
			data := mutate(r, base)
			if d := exactAsProtobuf(data, m); d != "" {
				t.Errorf("%T %x: %s", m, data, d)
			}
		}
	}
}

// TestExactRefusesBadUTF8: a string that is not UTF-8 is refused with
// protobuf-go's error, where the generated code alone would accept it.
func TestExactRefusesBadUTF8(t *testing.T) {
	data, err := proto.MarshalOptions{}.Marshal(&fsmv1.Release{SessionId: "s", Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	i := len(data) - 1 // the last byte of the name "n"
	data[i] = 0xff
	var vt fsmv1.Release
	if err := vt.UnmarshalVT(data); err != nil {
		t.Fatalf("the generated code refused it too (%v): the test shows nothing", err)
	}
	var m fsmv1.Release
	if d := exactAsProtobuf(data, &m); d != "" {
		t.Fatal(d)
	}
	if UnmarshalExact(data, &m) == nil {
		t.Fatal("accepted a name that is not UTF-8")
	}
}

// TestExactBoolVarints: a bool field written as any varint, not only 0 or
// 1 (2, 2^32, 2^63), reads as protobuf-go reads it, in every log command
// and snapshot message with a bool field. The generated code gathers a
// bool's varint in an int, which drops bits 32 and up on a 32-bit
// platform; there the test fails unless UnmarshalExact leaves those
// platforms to protobuf-go (run it with GOARCH=386).
func TestExactBoolVarints(t *testing.T) {
	bools := 0
	for _, m := range fsmSamples(t) {
		base, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		fields := m.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.Kind() != protoreflect.BoolKind || fd.IsList() {
				continue
			}
			bools++
			for _, v := range []uint64{2, 1 << 32, 1 << 63} {
				data := protowire.AppendTag(append([]byte(nil), base...), fd.Number(), protowire.VarintType)
				data = protowire.AppendVarint(data, v)
				if d := exactAsProtobuf(data, m); d != "" {
					t.Errorf("%T field %s = varint %d: %s", m, fd.Name(), v, d)
				}
			}
		}
	}
	if bools < 5 {
		t.Fatalf("only %d bool fields found", bools)
	}
}
