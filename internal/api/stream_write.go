package api

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Writing the session stream's answers. Connect flushes the response after
// every message, and each flush of net/http's HTTP/2 server is a hand-off
// to the connection's serve loop and a write syscall of its own. Answers
// that are ready together are written with one flush instead: a worker
// queues its answer, and whichever worker finds the stream's writer free
// writes every queued answer, then flushes once (flat combining: no writer
// goroutine, no hand-off when answers come one at a time).

// flushGate is the session stream's http.ResponseWriter: while held, a
// flush is only noted, and made when the gate is let go.
type flushGate struct {
	http.ResponseWriter
	held  atomic.Bool
	dirty atomic.Bool
}

// Flush implements http.Flusher.
func (g *flushGate) Flush() {
	if g.held.Load() {
		g.dirty.Store(true)
		return
	}
	g.flush()
}

func (g *flushGate) flush() {
	if f, ok := g.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the HTTP server's writer.
func (g *flushGate) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// hold defers flushes until let go.
func (g *flushGate) hold() { g.held.Store(true) }

// letGo flushes once if a flush was deferred.
func (g *flushGate) letGo() {
	g.held.Store(false)
	if g.dirty.Swap(false) {
		g.flush()
	}
}

// flushGateKey is the request context key of the stream's flushGate.
type flushGateKey struct{}

// coalesceFlushes gives the session stream's handler a flushGate, found
// by the stream in its request's context.
func coalesceFlushes(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := &flushGate{ResponseWriter: w}
		h.ServeHTTP(g, r.WithContext(context.WithValue(r.Context(), flushGateKey{}, g)))
	})
}

// gateOf returns the flushGate of a stream's context, or nil.
func gateOf(ctx context.Context) *flushGate {
	g, _ := ctx.Value(flushGateKey{}).(*flushGate)
	return g
}

// queuedAnswer is an answer waiting to be written, with the pool slot it
// holds until then (a notice: one of its stream's notice slots, notices.go; nil: none).
type queuedAnswer struct {
	resp  *lockdv1.StreamResponse
	slots chan struct{}
}

// answerQueue holds the answers of one stream not yet written.
type answerQueue struct {
	mu    sync.Mutex
	q     []queuedAnswer
	spare []queuedAnswer // the last batch's array, reused
}

// push queues an answer.
func (aq *answerQueue) push(a queuedAnswer) {
	aq.mu.Lock()
	if aq.q == nil {
		aq.q, aq.spare = aq.spare, nil
	}
	aq.q = append(aq.q, a)
	aq.mu.Unlock()
}

// take returns every queued answer (empty if none).
func (aq *answerQueue) take() []queuedAnswer {
	aq.mu.Lock()
	defer aq.mu.Unlock()
	b := aq.q
	aq.q = nil
	return b
}

// done gives a written batch's array back for reuse.
func (aq *answerQueue) done(b []queuedAnswer) {
	clear(b)
	aq.mu.Lock()
	if aq.spare == nil {
		aq.spare = b[:0]
	}
	aq.mu.Unlock()
}

// empty reports whether no answer is queued.
func (aq *answerQueue) empty() bool {
	aq.mu.Lock()
	defer aq.mu.Unlock()
	return len(aq.q) == 0
}

// answer queues an answer and, if no other worker is writing, writes
// every queued answer with one flush; a worker that finds the writer busy
// leaves its answer to it. A slot is freed once its answer is written:
// answers waiting for a slow reader hold their slots too. After a failed
// write (the client is gone) nothing more is written and the calls in
// flight are stopped.
func (sv *streamServer) answer(resp *lockdv1.StreamResponse, slots chan struct{}) {
	sv.queue.push(queuedAnswer{resp, slots})
	for sv.sendMu.TryLock() {
		sv.writeQueued()
		sv.sendMu.Unlock()
		// An answer queued after the last take, by a worker that found
		// the writer busy, is this worker's to write.
		if sv.queue.empty() {
			return
		}
	}
}

// writeQueued writes the queued answers until none is left; sendMu is
// held.
func (sv *streamServer) writeQueued() {
	for {
		b := sv.queue.take()
		if len(b) == 0 {
			return
		}
		if sv.gate != nil && len(b) > 1 {
			sv.gate.hold()
		}
		for _, a := range b {
			if sv.sendErr == nil {
				if sv.sendErr = sv.st.Send(a.resp); sv.sendErr != nil {
					sv.cancel()
				}
			}
		}
		if sv.gate != nil {
			sv.gate.letGo()
		}
		if sv.upgraded { // only the heartbeats read it
			sv.lastWrite.Store(time.Since(streamEpoch).Nanoseconds())
		}
		for _, a := range b {
			if a.slots != nil { // nil: an answer that holds no slot
				<-a.slots
			}
		}
		sv.queue.done(b)
	}
}
