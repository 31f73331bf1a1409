package server

import (
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
)

func ev(index uint64, num uint32, name string) fsm.Event {
	return fsm.Event{Index: index, Num: num, Name: name, Kind: fsm.EventGranted}
}

// The history keeps its size, filters by prefix, and resets a cursor that
// left it, or that a snapshot restore cut off (after the restore's first
// entry tells where events start again).
func TestHub(t *testing.T) {
	h := newHub(3)
	h.Events(5, []fsm.Event{ev(5, 1, "a/1"), ev(5, 2, "b/1")})
	h.Events(6, []fsm.Event{ev(6, 1, "a/2")})
	buf := make([]fsm.Event, 0, 10)
	r := h.read(pos{5, 1}, "a/", buf)
	if r.reset || len(r.events) != 1 || r.events[0].Name != "a/2" || r.next != (pos{6, 1}) {
		t.Fatalf("read after 5.1: %+v", r)
	}
	if r := h.read(pos{6, 1}, "", buf); r.wait == nil || len(r.events) != 0 {
		t.Fatalf("read at the head: %+v, want a wait", r)
	}
	if r := h.read(pos{9, 0}, "", buf); r.wait == nil {
		t.Fatalf("read ahead of the node: %+v, want a wait", r)
	}
	h.Events(7, []fsm.Event{ev(7, 1, "a/3")}) // evicts 5.1
	if h.stored() != 3 {
		t.Fatalf("stored %d, want 3", h.stored())
	}
	if r := h.read(pos{4, 0}, "", buf); !r.reset || r.next != (pos{7, 1}) {
		t.Fatalf("read from before the history: %+v, want a reset to 7.1", r)
	}
	if r := h.read(pos{5, 1}, "", buf); r.reset || len(r.events) != 3 {
		t.Fatalf("read from the evicted event itself: %+v, want the 3 after it", r)
	}

	h.Reset(0) // a snapshot restore
	r = h.read(pos{7, 1}, "", buf)
	if r.reset || r.wait == nil {
		t.Fatalf("read while restoring: %+v, want a wait", r)
	}
	h.Reset(12)
	select {
	case <-r.wait:
	default:
		t.Fatal("the end of a restore did not wake the reader")
	}
	if r := h.read(pos{7, 1}, "", buf); !r.reset || r.next != (pos{12, 0}) {
		t.Fatalf("read from before the restore: %+v, want a reset to 12.0", r)
	}
	if p := h.now(); p != (pos{12, 0}) {
		t.Fatalf("now %v, want 12.0", p)
	}
}
