package wire

import (
	"context"
	"sync"
	"sync/atomic"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Sending a stream's frames. Calls queue their requests, and whichever
// call finds the stream's sender free sends every queued request (flat
// combining: no sender goroutine, no hand-off when calls come one at a
// time). While it sends a batch, the stream's moreHint says how many of
// the batch's requests follow the one being written, and the request
// body (envelopeBody) keeps reading while it is not zero: the frames
// queued together leave in one DATA frame and one write, without waiting
// for any frame not already queued.

// sendQueue holds a stream's requests not yet sent.
type sendQueue struct {
	mu sync.Mutex
	q  []*lockdv1.StreamRequest
}

func (sq *sendQueue) push(r *lockdv1.StreamRequest) {
	sq.mu.Lock()
	sq.q = append(sq.q, r)
	sq.mu.Unlock()
}

func (sq *sendQueue) take() []*lockdv1.StreamRequest {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	b := sq.q
	sq.q = nil
	return b
}

// remove takes r off the queue; false if it is not queued (a sender took
// it).
func (sq *sendQueue) remove(r *lockdv1.StreamRequest) bool {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	for i, q := range sq.q {
		if q == r {
			sq.q = append(sq.q[:i], sq.q[i+1:]...)
			return true
		}
	}
	return false
}

func (sq *sendQueue) empty() bool {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	return len(sq.q) == 0
}

// moreHintKey is the stream request's context key of its moreHint.
type moreHintKey struct{}

// withMoreHint returns ctx carrying a new moreHint, for the stream's
// request body to find.
func withMoreHint(ctx context.Context) (context.Context, *atomic.Int32) {
	h := new(atomic.Int32)
	return context.WithValue(ctx, moreHintKey{}, h), h
}

// upgradedKey is the stream request's context key of the flag its
// transport sets when the stream went on an upgraded connection
// (upgrade.go).
type upgradedKey struct{}

// withUpgradeMark returns ctx carrying a new flag for the stream's
// transport to set when it upgrades.
func withUpgradeMark(ctx context.Context) (context.Context, *atomic.Bool) {
	b := new(atomic.Bool)
	return context.WithValue(ctx, upgradedKey{}, b), b
}

// markUpgraded sets the flag of a request's context, if it has one.
func markUpgraded(ctx context.Context) {
	if b, _ := ctx.Value(upgradedKey{}).(*atomic.Bool); b != nil {
		b.Store(true)
	}
}

// moreHintOf returns the moreHint of a request's context, or nil.
func moreHintOf(ctx context.Context) *atomic.Int32 {
	h, _ := ctx.Value(moreHintKey{}).(*atomic.Int32)
	return h
}

// send queues req and, if no other call is sending, sends every queued
// request. A failed send fails the stream (Fail), and with it every
// pending call.
func (s *Stream) send(req *lockdv1.StreamRequest) {
	s.sendQ.push(req)
	for s.sendMu.TryLock() {
		s.sendQueued()
		s.sendMu.Unlock()
		// A request queued after the last take, by a call that found
		// the sender busy, is this call's to send.
		if s.sendQ.empty() {
			return
		}
	}
}

// sendQueued sends the queued requests until none is left; sendMu is
// held.
func (s *Stream) sendQueued() {
	for {
		b := s.sendQ.take()
		if len(b) == 0 {
			return
		}
		for i, r := range b {
			if s.more != nil {
				s.more.Store(int32(len(b) - 1 - i))
			}
			if err := s.st.Send(r); err != nil {
				s.Fail(err)
			}
		}
		if s.more != nil {
			s.more.Store(0)
		}
	}
}

// withdraw is for a call that returns before its answer (its ctx or the
// stream ended): once it returns, nothing reads the call's request, whose
// message is the caller's again. A request still queued is taken off (it
// is never sent); one a sender has taken is sent, or fails, first, as
// when each call sent its own request before waiting for the answer.
func (s *Stream) withdraw(req *lockdv1.StreamRequest) {
	if s.sendQ.remove(req) {
		return
	}
	s.sendMu.Lock()
	s.sendQueued()
	s.sendMu.Unlock()
	// As in send: a request queued meanwhile by a call that found the
	// sender busy is this call's to send.
	for !s.sendQ.empty() && s.sendMu.TryLock() {
		s.sendQueued()
		s.sendMu.Unlock()
	}
}
