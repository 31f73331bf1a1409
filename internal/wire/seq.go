package wire

import (
	"sync"
	"sync/atomic"
)

// SeqTracker hands out a session's request sequence numbers and computes
// the ack: the lowest seq whose answer the client has not seen yet, below
// which the server may forget its remembered answers.
type SeqTracker struct {
	mu       sync.Mutex
	last     uint64
	inflight []uint64 // ascending
}

// SeqReq is one request's sequence number, in flight from begin until its
// end: until then the ack stays at or below it, so the server keeps the
// answer a resend needs.
type SeqReq struct {
	t     *SeqTracker
	Seq   uint64
	ended atomic.Bool
}

// Begin allocates the next seq and marks it in flight.
func (t *SeqTracker) Begin() *SeqReq {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	t.inflight = append(t.inflight, t.last)
	return &SeqReq{t: t, Seq: t.last}
}

// End marks the request answered (or abandoned). Only the first call
// counts, so every path may end it (a deferred end included).
func (r *SeqReq) End() {
	if r.ended.Swap(true) {
		return
	}
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, s := range t.inflight {
		if s == r.Seq {
			t.inflight = append(t.inflight[:i], t.inflight[i+1:]...)
			return
		}
	}
}

// Pass hands the request on to a new owner that ends it later (a cleanup
// that outlives the call that began it): ending the old handle then does
// nothing. It returns nil when the request already ended.
func (r *SeqReq) Pass() *SeqReq {
	if r.ended.Swap(true) {
		return nil
	}
	return &SeqReq{t: r.t, Seq: r.Seq}
}

// Ack returns the lowest seq in flight, or the next seq when none is.
func (t *SeqTracker) Ack() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.inflight) == 0 {
		return t.last + 1
	}
	return t.inflight[0]
}
