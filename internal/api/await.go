package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// await blocks a queued Acquire until its grant, its drop, the poll
// timeout, the caller's end or a leadership change of this node, whichever
// is first, and fills resp: GRANTED with the token, or QUEUED with the
// position.
//
// A waiter blocked on a leader that is deposed would not hear of a grant
// the new leader makes (this node may never apply it): the wait ends on any
// leadership change (changed, taken before the proposal), and the client
// repeats the same request on the new leader, which answers from its state.
func (a *api) await(ctx context.Context, key node.WaitKey, poll time.Duration, changed <-chan struct{}, resp *lockdv1.AcquireResponse) error {
	ch, stop := a.s.waiters.Watch(key)
	defer stop()
	status, token, _, budget := a.s.fsm.WaitState(key.Session, key.Name, key.Seq)
	switch status {
	case fsm.StatusGranted:
		resp.Status, resp.Token, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, token, BudgetPB(budget)
		return nil
	case 0:
		return a.dropped(key.Session, key.Name)
	}
	timer := time.NewTimer(poll)
	defer timer.Stop()
	select {
	case o := <-ch:
		if o.Dropped {
			return a.dropped(key.Session, key.Name)
		}
		resp.Status, resp.Token, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, o.Token, BudgetPB(o.MaxHold)
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
		return a.s.errs.RaftError(raft.ErrRaftShutdown)
	case <-changed:
		return a.s.errs.RaftError(raft.ErrLeadershipLost)
	}
	status, token, pos, budget := a.s.fsm.WaitState(key.Session, key.Name, key.Seq)
	switch status {
	case fsm.StatusGranted:
		resp.Status, resp.Token, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, token, BudgetPB(budget)
	case fsm.StatusQueued:
		resp.Status, resp.Position = lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED, pos
	default:
		return a.dropped(key.Session, key.Name)
	}
	return nil
}

// dropped explains a wait that ended without a grant: the session is gone
// (lease lost), the lock's job was completed, or the wait was cancelled.
func (a *api) dropped(session, name string) error {
	info, ok := a.s.fsm.Session(session)
	if !ok {
		return a.s.errs.APIError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session expired or closed while waiting")
	}
	if info.Revoked {
		return a.s.errs.APIError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED, "session was force-released while waiting")
	}
	if l, ok := a.s.fsm.Describe(name); ok && l.Mark != nil {
		return a.s.errs.ResultError(&fsm.Result{Code: fsm.CodeAlreadyDone, Msg: fmt.Sprintf("the job of lock %q was completed while waiting", name), Mark: l.Mark})
	}
	return a.s.errs.APIError(connect.CodeAborted, lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED, "the wait was cancelled")
}
