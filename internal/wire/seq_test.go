package wire

import "testing"

func TestSeqTracker(t *testing.T) {
	var q SeqTracker
	if got := q.Ack(); got != 1 {
		t.Errorf("ack before any request = %d, want 1", got)
	}
	a, b, c := q.Begin(), q.Begin(), q.Begin()
	if a.Seq != 1 || b.Seq != 2 || c.Seq != 3 {
		t.Fatalf("seqs %d %d %d, want 1 2 3", a.Seq, b.Seq, c.Seq)
	}
	if got := q.Ack(); got != 1 {
		t.Errorf("ack = %d, want 1", got)
	}
	b.End()
	if got := q.Ack(); got != 1 {
		t.Errorf("ack with 1 still in flight = %d, want 1", got)
	}
	// A handle passed on stays in flight until its new owner ends it.
	a2 := a.Pass()
	a.End()
	if got := q.Ack(); got != 1 {
		t.Errorf("ack after ending a passed handle = %d, want 1", got)
	}
	a2.End()
	if got := q.Ack(); got != 3 {
		t.Errorf("ack = %d, want 3", got)
	}
	if a.Pass() != nil {
		t.Error("an ended request was passed on")
	}
	c.End()
	c.End() // ending twice is harmless
	if got := q.Ack(); got != 4 {
		t.Errorf("ack with nothing in flight = %d, want 4", got)
	}
}
