package server

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/internal/lease"
)

type waitKey struct {
	session, name string
	seq           uint64
}

// waitOutcome is what a blocked Acquire call learns.
type waitOutcome struct {
	token   uint64 // granted with this token
	dropped bool   // left the queue without a grant
}

// waiters wakes blocked Acquire calls. The FSM tells it of grants and drops
// from Apply; it wakes exactly the calls waiting on that request, never
// every waiter of the lock.
type waiters struct {
	mu    sync.Mutex
	m     map[waitKey][]chan waitOutcome
	woken func() // counts wake-ups (metric)
}

func newWaiters(woken func()) *waiters {
	return &waiters{m: map[waitKey][]chan waitOutcome{}, woken: woken}
}

// watch registers interest in a queued request. The returned cancel must be
// called when the caller stops waiting.
func (w *waiters) watch(k waitKey) (<-chan waitOutcome, func()) {
	ch := make(chan waitOutcome, 1)
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

func (w *waiters) notify(k waitKey, o waitOutcome) {
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

// observer fans FSM events out to the lease manager, the completion-mark
// timers and the waiters.
type observer struct {
	lease   *lease.Manager
	marks   *lease.Manager // completion marks, keyed by markKey
	delays  *lease.Manager // lock-delays, keyed by markKey(name, token)
	waiters *waiters
}

// markKey names a completion mark (or a lock-delay) in its manager: the
// lock and the token that identifies the mark or delay.
func markKey(name string, token uint64) string { return strconv.FormatUint(token, 10) + " " + name }

// parseMarkKey undoes markKey.
func parseMarkKey(key string) (name string, token uint64, ok bool) {
	tok, name, ok := strings.Cut(key, " ")
	if !ok {
		return "", 0, false
	}
	token, err := strconv.ParseUint(tok, 10, 64)
	return name, token, err == nil
}

func (o *observer) MarkSet(name string, token uint64, retentionMs int64) {
	if o.marks != nil {
		o.marks.Created(markKey(name, token), time.Duration(retentionMs)*time.Millisecond)
	}
}

func (o *observer) LockDelayed(name string, token uint64, delayMs int64) {
	if o.delays != nil {
		o.delays.Created(markKey(name, token), time.Duration(delayMs)*time.Millisecond)
	}
}

func (o *observer) DelayEnded(name string, token uint64) {
	if o.delays != nil {
		o.delays.Removed(markKey(name, token))
	}
}

func (o *observer) MarkCleared(name string, token uint64) {
	if o.marks != nil {
		o.marks.Removed(markKey(name, token))
	}
}

func (o *observer) SessionCreated(id string, ttlMs int64) {
	o.lease.Created(id, time.Duration(ttlMs)*time.Millisecond)
}
func (o *observer) SessionRemoved(id string) { o.lease.Removed(id) }
func (o *observer) SessionRevoked(id string) { o.lease.Revoked(id) }
func (o *observer) WaitGranted(session, name string, seq, token uint64) {
	o.waiters.notify(waitKey{session, name, seq}, waitOutcome{token: token})
}
func (o *observer) WaitDropped(session, name string, seq uint64) {
	o.waiters.notify(waitKey{session, name, seq}, waitOutcome{dropped: true})
}

// Restored: the leader re-promotes after a restore (it only happens on
// followers and at start-up, when the manager is inactive anyway).
func (o *observer) Restored() {}
