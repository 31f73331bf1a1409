package node

import (
	"sync"
	"time"
)

// This file holds blocked Acquire calls: the registry the FSM's events
// wake (Waiters); the wait of one queued Acquire is the API side.

// WaitKey names one queued Acquire: its session, lock and request seq.
type WaitKey struct {
	Session, Name string
	Seq           uint64
}

// WaitOutcome is what a blocked Acquire call learns.
type WaitOutcome struct {
	Token   uint64        // granted with this token
	MaxHold time.Duration // the grant's hold budget (0: none)
	Dropped bool          // left the queue without a grant
}

// Waiters wakes blocked Acquire calls. The FSM tells it of grants and drops
// from Apply; it wakes exactly the calls waiting on that request, never
// every waiter of the lock.
type Waiters struct {
	mu    sync.Mutex
	m     map[WaitKey][]chan WaitOutcome
	woken func() // counts wake-ups (metric)
}

// NewWaiters returns an empty registry; woken, when not nil, is called for every call woken.
func NewWaiters(woken func()) *Waiters {
	return &Waiters{m: map[WaitKey][]chan WaitOutcome{}, woken: woken}
}

// Watch registers interest in a queued request. The returned cancel must be
// called when the caller stops waiting.
func (w *Waiters) Watch(k WaitKey) (<-chan WaitOutcome, func()) {
	ch := make(chan WaitOutcome, 1)
	w.mu.Lock()
	w.m[k] = append(w.m[k], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.m[k]
		for i, c := range list {
			if c == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(w.m, k)
		} else {
			w.m[k] = list
		}
	}
}

// Notify wakes the calls waiting on k with o (Apply calls it, through the Fanout).
func (w *Waiters) Notify(k WaitKey, o WaitOutcome) {
	w.mu.Lock()
	list := w.m[k]
	delete(w.m, k)
	w.mu.Unlock()
	for _, ch := range list {
		ch <- o // buffered, one send per channel
		if w.woken != nil {
			w.woken()
		}
	}
}
