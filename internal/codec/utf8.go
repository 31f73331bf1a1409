package codec

import (
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// protobuf-go refuses a proto3 string field that is not valid UTF-8; the
// generated UnmarshalVT does not check. validUTF8 checks every string
// field of an encoded message (nested messages, oneofs, repeated fields
// and map entries included) against a table of the message's fields made
// once per message type, without decoding. Anything it cannot vouch for
// goes to protobuf-go, which reads it or says why not.
//
// It cannot vouch either for input the generated code reads otherwise
// than protobuf-go: a known field with another wire type than its own
// (protobuf-go keeps it as an unknown field, the generated code refuses
// it), a field number above protowire.MaxValidNumber (protobuf-go
// refuses it, the generated code skips it), a tag not in its shortest
// form (protobuf-go keeps an unknown field's tag re-encoded, the
// generated code as it came), and an unknown field in a
// message without generated code of its own (the well-known types, whose
// vtprotobuf code drops unknown fields where protobuf-go keeps them).

const (
	kOther byte = iota
	kString
	kMessage
)

// fieldTable says, by field number, which fields of a message are strings
// (checked) and which are messages (scanned with their own table).
type fieldTable struct {
	kinds []byte
	subs  []*fieldTable
	// wire is each known field's wire type (-1: no such field), and
	// packed says a repeated scalar, which may also come packed (bytes).
	wire   []int8
	packed []bool
	// strict: an unknown field sends the input to protobuf-go.
	strict bool
}

var tables sync.Map // protoreflect.MessageDescriptor → *fieldTable (a descriptor hashes faster than its name)

// tableOf returns md's table.
func tableOf(md protoreflect.MessageDescriptor) *fieldTable {
	if t, ok := tables.Load(md); ok {
		return t.(*fieldTable)
	}
	t := buildTable(md, map[protoreflect.FullName]*fieldTable{})
	tables.Store(md, t)
	return t
}

// buildTable makes md's table; seen ends recursive message types.
func buildTable(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*fieldTable) *fieldTable {
	if t := seen[md.FullName()]; t != nil {
		return t
	}
	t := &fieldTable{}
	seen[md.FullName()] = t
	fields := md.Fields()
	maxNum := 0
	for i := range fields.Len() {
		maxNum = max(maxNum, int(fields.Get(i).Number()))
	}
	t.kinds, t.subs = make([]byte, maxNum+1), make([]*fieldTable, maxNum+1)
	t.wire, t.packed = make([]int8, maxNum+1), make([]bool, maxNum+1)
	for i := range t.wire {
		t.wire[i] = -1
	}
	t.strict = !hasGeneratedCode(md)
	for i := range fields.Len() {
		fd := fields.Get(i)
		t.wire[fd.Number()] = int8(wireTypeOf(fd.Kind()))
		t.packed[fd.Number()] = fd.IsList() && t.wire[fd.Number()] != int8(protowire.BytesType) && fd.Kind() != protoreflect.GroupKind
		switch fd.Kind() {
		case protoreflect.StringKind:
			t.kinds[fd.Number()] = kString
		case protoreflect.MessageKind:
			t.kinds[fd.Number()] = kMessage
			t.subs[fd.Number()] = buildTable(fd.Message(), seen)
		}
	}
	return t
}

// validUTF8 reports whether b, an encoded message of table t, is well
// formed as far as it looks and every string field in it is valid UTF-8.
func validUTF8(b []byte, t *fieldTable) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		if num > protowire.MaxValidNumber || n != protowire.SizeTag(num) {
			return false
		}
		b = b[n:]
		if int(num) >= len(t.wire) || t.wire[num] < 0 {
			if t.strict {
				return false
			}
		} else if protowire.Type(t.wire[num]) != typ && !(t.packed[num] && typ == protowire.BytesType) {
			return false
		}
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return false
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if int(num) >= len(t.kinds) {
			continue // unknown field: kept as bytes
		}
		switch t.kinds[num] {
		case kString:
			if !utf8.Valid(v) {
				return false
			}
		case kMessage:
			if !validUTF8(v, t.subs[num]) {
				return false
			}
		}
	}
	return true
}

// wireTypeOf returns the wire type of a field of kind k.
func wireTypeOf(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	}
	return protowire.VarintType
}

// hasGeneratedCode reports whether md's Go type has generated code of its
// own (implements Message), which keeps unknown fields.
func hasGeneratedCode(md protoreflect.MessageDescriptor) bool {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		return false
	}
	_, ok := mt.New().Interface().(Message)
	return ok
}
