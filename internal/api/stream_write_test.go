package api

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// flushCounter is the HTTP server's writer as the gate sees it: a real
// httptest.ResponseRecorder, counting flushes.
type flushCounter struct {
	*httptest.ResponseRecorder
	n int
}

func (f *flushCounter) Flush() { f.n++; f.ResponseRecorder.Flush() }

func TestFlushGateDefersFlushesWhileHeld(t *testing.T) {
	under := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	g := &flushGate{ResponseWriter: under}
	g.Flush()
	if under.n != 1 {
		t.Fatalf("a flush of a gate not held: %d flushes, want 1", under.n)
	}
	g.hold()
	for range 5 {
		g.Flush()
	}
	if under.n != 1 {
		t.Fatalf("flushes while held reached the writer: %d, want 1", under.n)
	}
	g.letGo()
	if under.n != 2 {
		t.Fatalf("after letGo: %d flushes, want 2 (one for the five held)", under.n)
	}
	g.hold()
	g.letGo()
	if under.n != 2 {
		t.Fatalf("letGo without a held flush flushed: %d, want 2", under.n)
	}
	if http.NewResponseController(g).Flush() != nil || under.n != 3 {
		t.Fatalf("ResponseController through the gate: %d flushes, want 3", under.n)
	}
}

func TestAnswerQueueTakesAllInOrder(t *testing.T) {
	var aq answerQueue
	for i := range 3 {
		aq.push(queuedAnswer{slots: make(chan struct{}, i+1)})
	}
	b := aq.take()
	if len(b) != 3 || cap(b[2].slots) != 3 || !aq.empty() {
		t.Fatalf("take: %d answers, queue empty %v", len(b), aq.empty())
	}
	aq.done(b)
	aq.push(queuedAnswer{})
	if b2 := aq.take(); len(b2) != 1 || &b2[0] != &b[0] {
		t.Fatalf("the next batch does not reuse the last one's array")
	}
}
