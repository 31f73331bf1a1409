package lockd

import (
	"sync"
	"sync/atomic"
)

// seqTracker hands out a session's request sequence numbers and computes
// the ack: the lowest seq whose answer the client has not seen yet, below
// which the server may forget its remembered answers.
type seqTracker struct {
	mu       sync.Mutex
	last     uint64
	inflight []uint64 // ascending
}

// seqReq is one request's sequence number, in flight from begin until its
// end: until then the ack stays at or below it, so the server keeps the
// answer a resend needs.
type seqReq struct {
	t     *seqTracker
	seq   uint64
	ended atomic.Bool
}

// begin allocates the next seq and marks it in flight.
func (t *seqTracker) begin() *seqReq {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	t.inflight = append(t.inflight, t.last)
	return &seqReq{t: t, seq: t.last}
}

// end marks the request answered (or abandoned). Only the first call
// counts, so every path may end it (a deferred end included).
func (r *seqReq) end() {
	if r.ended.Swap(true) {
		return
	}
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, s := range t.inflight {
		if s == r.seq {
			t.inflight = append(t.inflight[:i], t.inflight[i+1:]...)
			return
		}
	}
}

// pass hands the request on to a new owner that ends it later (a cleanup
// that outlives the call that began it): ending the old handle then does
// nothing. It returns nil when the request already ended.
func (r *seqReq) pass() *seqReq {
	if r.ended.Swap(true) {
		return nil
	}
	return &seqReq{t: r.t, seq: r.seq}
}

// ack returns the lowest seq in flight, or the next seq when none is.
func (t *seqTracker) ack() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.inflight) == 0 {
		return t.last + 1
	}
	return t.inflight[0]
}
