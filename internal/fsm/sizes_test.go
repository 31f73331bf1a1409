package fsm

import (
	"testing"
	"unsafe"
)

// TestStructSizes guards the sizes of what the table keeps once per lock,
// hold and wait (a million locks: every 8 bytes is 8 MB): a new field that
// tips one into a larger allocation class should be a decision, taken with
// bench/memory.sh, not an accident.
func TestStructSizes(t *testing.T) {
	for _, c := range []struct {
		name     string
		got, max uintptr
	}{
		{"lock", unsafe.Sizeof(lock{}), 96},
		{"hold", unsafe.Sizeof(hold{}), 80},
		{"wait", unsafe.Sizeof(wait{}), 80},
	} {
		if c.got > c.max {
			t.Errorf("%s is %d bytes, more than %d: reorder its fields or measure the memory cost (bench/memory.sh)", c.name, c.got, c.max)
		}
	}
}
