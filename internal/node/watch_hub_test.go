package node

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
	h := NewHub(3)
	h.Events(5, []fsm.Event{ev(5, 1, "a/1"), ev(5, 2, "b/1")})
	h.Events(6, []fsm.Event{ev(6, 1, "a/2")})
	buf := make([]fsm.Event, 0, 10)
	r := h.Read(Pos{5, 1}, "a/", buf)
	if r.Reset || len(r.Events) != 1 || r.Events[0].Name != "a/2" || r.Next != (Pos{6, 1}) {
		t.Fatalf("read after 5.1: %+v", r)
	}
	if r := h.Read(Pos{6, 1}, "", buf); r.Wait == nil || len(r.Events) != 0 {
		t.Fatalf("read at the head: %+v, want a wait", r)
	}
	if r := h.Read(Pos{9, 0}, "", buf); r.Wait == nil {
		t.Fatalf("read ahead of the node: %+v, want a wait", r)
	}
	h.Events(7, []fsm.Event{ev(7, 1, "a/3")}) // evicts 5.1
	if h.Stored() != 3 {
		t.Fatalf("stored %d, want 3", h.Stored())
	}
	if r := h.Read(Pos{4, 0}, "", buf); !r.Reset || r.Next != (Pos{7, 1}) {
		t.Fatalf("read from before the history: %+v, want a reset to 7.1", r)
	}
	if r := h.Read(Pos{5, 1}, "", buf); r.Reset || len(r.Events) != 3 {
		t.Fatalf("read from the evicted event itself: %+v, want the 3 after it", r)
	}

	h.Reset(0) // a snapshot restore
	r = h.Read(Pos{7, 1}, "", buf)
	if r.Reset || r.Wait == nil {
		t.Fatalf("read while restoring: %+v, want a wait", r)
	}
	h.Reset(12)
	select {
	case <-r.Wait:
	default:
		t.Fatal("the end of a restore did not wake the reader")
	}
	if r := h.Read(Pos{7, 1}, "", buf); !r.Reset || r.Next != (Pos{12, 0}) {
		t.Fatalf("read from before the restore: %+v, want a reset to 12.0", r)
	}
	if p := h.Now(); p != (Pos{12, 0}) {
		t.Fatalf("now %v, want 12.0", p)
	}
}
