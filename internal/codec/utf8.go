package codec

import (
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// protobuf-go refuses a proto3 string field that is not valid UTF-8; the
// generated UnmarshalVT does not check. validUTF8 checks every string
// field of an encoded message (nested messages, oneofs, repeated fields
// and map entries included) against a table of the message's fields made
// once per message type, without decoding. Anything it cannot vouch for
// goes to protobuf-go, which reads it or says why not.

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
}

var tables sync.Map // protoreflect.FullName → *fieldTable

// tableOf returns md's table.
func tableOf(md protoreflect.MessageDescriptor) *fieldTable {
	if t, ok := tables.Load(md.FullName()); ok {
		return t.(*fieldTable)
	}
	t := buildTable(md, map[protoreflect.FullName]*fieldTable{})
	tables.Store(md.FullName(), t)
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
	for i := range fields.Len() {
		fd := fields.Get(i)
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
		b = b[n:]
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
