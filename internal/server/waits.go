package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// This file holds blocked Acquire calls: the registry the FSM's events
// wake (waiters) and the wait of one queued Acquire.

type waitKey struct {
	session, name string
	seq           uint64
}

// waitOutcome is what a blocked Acquire call learns.
type waitOutcome struct {
	token   uint64        // granted with this token
	maxHold time.Duration // the grant's hold budget (0: none)
	dropped bool          // left the queue without a grant
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

// await blocks a queued Acquire until its grant, its drop, the poll
// timeout, the caller's end or a leadership change of this node, whichever
// is first, and fills resp: GRANTED with the token, or QUEUED with the
// position.
//
// A waiter blocked on a leader that is deposed would not hear of a grant
// the new leader makes (this node may never apply it): the wait ends on any
// leadership change (changed, taken before the proposal), and the client
// repeats the same request on the new leader, which answers from its state.
func (a *api) await(ctx context.Context, key waitKey, poll time.Duration, changed <-chan struct{}, resp *lockdv1.AcquireResponse) error {
	ch, stop := a.s.waiters.watch(key)
	defer stop()
	status, token, _, budget := a.s.fsm.WaitState(key.session, key.name, key.seq)
	switch status {
	case fsm.StatusGranted:
		resp.Status, resp.Token, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, token, budgetPB(budget)
		return nil
	case 0:
		return a.dropped(key.session, key.name)
	}
	timer := time.NewTimer(poll)
	defer timer.Stop()
	select {
	case o := <-ch:
		if o.dropped {
			return a.dropped(key.session, key.name)
		}
		resp.Status, resp.Token, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, o.token, budgetPB(o.maxHold)
		return nil
	case <-timer.C:
		// A "queued" answer tells the client its grant comes after this
		// call was sent; its hold budget is counted from that send
		// (lease.ClientHoldDeadline). Only a leader still in office may
		// say so: a deposed one's state may lack a grant made since.
		if err := a.read(lockdv1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE); err != nil {
			return err
		}
	case <-ctx.Done():
		code := connect.CodeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return connect.NewError(code, ctx.Err())
	case <-a.s.done:
		return a.s.raftError(raft.ErrRaftShutdown)
	case <-changed:
		return a.s.raftError(raft.ErrLeadershipLost)
	}
	status, token, pos, budget := a.s.fsm.WaitState(key.session, key.name, key.seq)
	switch status {
	case fsm.StatusGranted:
		resp.Status, resp.Token, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, token, budgetPB(budget)
	case fsm.StatusQueued:
		resp.Status, resp.Position = lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED, pos
	default:
		return a.dropped(key.session, key.name)
	}
	return nil
}

// dropped explains a wait that ended without a grant: the session is gone
// (lease lost), the lock's job was completed, or the wait was cancelled.
func (a *api) dropped(session, name string) error {
	info, ok := a.s.fsm.Session(session)
	if !ok {
		return a.s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session expired or closed while waiting")
	}
	if info.Revoked {
		return a.s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED, "session was force-released while waiting")
	}
	if l, ok := a.s.fsm.Describe(name); ok && l.Mark != nil {
		return a.s.resultError(&fsm.Result{Code: fsm.CodeAlreadyDone, Msg: fmt.Sprintf("the job of lock %q was completed while waiting", name), Mark: l.Mark})
	}
	return a.s.apiError(connect.CodeAborted, lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED, "the wait was cancelled")
}
