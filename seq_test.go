package lockd

import "testing"

func TestSeqTracker(t *testing.T) {
	var q seqTracker
	if got := q.ack(); got != 1 {
		t.Errorf("ack before any request = %d, want 1", got)
	}
	a, b, c := q.begin(), q.begin(), q.begin()
	if a.seq != 1 || b.seq != 2 || c.seq != 3 {
		t.Fatalf("seqs %d %d %d, want 1 2 3", a.seq, b.seq, c.seq)
	}
	if got := q.ack(); got != 1 {
		t.Errorf("ack = %d, want 1", got)
	}
	b.end()
	if got := q.ack(); got != 1 {
		t.Errorf("ack with 1 still in flight = %d, want 1", got)
	}
	// A handle passed on stays in flight until its new owner ends it.
	a2 := a.pass()
	a.end()
	if got := q.ack(); got != 1 {
		t.Errorf("ack after ending a passed handle = %d, want 1", got)
	}
	a2.end()
	if got := q.ack(); got != 3 {
		t.Errorf("ack = %d, want 3", got)
	}
	if a.pass() != nil {
		t.Error("an ended request was passed on")
	}
	c.end()
	c.end() // ending twice is harmless
	if got := q.ack(); got != 4 {
		t.Errorf("ack with nothing in flight = %d, want 4", got)
	}
}
