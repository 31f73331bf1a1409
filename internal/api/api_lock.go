package api

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/node"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Lock RPCs that write: acquire, release, cancel, complete, force release.

// Acquire takes a lock or queues for it, blocking up to the poll timeout.
func (a *api) Acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (*connect.Response[lockdv1.AcquireResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Acquire, func() (*connect.Response[lockdv1.AcquireResponse], error) { return a.acquire(ctx, req) })
}

func (a *api) acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (res *connect.Response[lockdv1.AcquireResponse], err error) {
	start := time.Now()
	var queuedAt time.Time // set when the request waits in the queue
	defer func() { a.s.metrics.lock.Acquired(start, queuedAt, res, err) }()
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	mode := int32(m.Mode)
	if m.Mode == lockdv1.Mode_MODE_UNSPECIFIED {
		mode = fsm.ModeExclusive
	}
	poll := a.s.cfg.MaxPollTimeout
	if m.PollTimeout != nil {
		if err := m.PollTimeout.CheckValid(); err != nil || m.PollTimeout.AsDuration() < 0 {
			return nil, a.s.errs.Invalid("poll_timeout must be a non-negative duration")
		}
		poll = min(poll, m.PollTimeout.AsDuration())
	}
	var delay time.Duration
	if m.LockDelay != nil {
		if err := m.LockDelay.CheckValid(); err != nil || m.LockDelay.AsDuration() < 0 {
			return nil, a.s.errs.Invalid("lock_delay must be a duration from 0 to 1h")
		}
		delay = m.LockDelay.AsDuration()
	}
	cmd := &fsmv1.Acquire{
		SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, Mode: mode, Limit: m.Limit,
		Wait: m.Wait, Value: m.Value, LockDelayMs: delay.Milliseconds(),
		// Deadlock refusal changes what Apply decides: only once every
		// member applies it (the version gate; docs/design.md).
		RefuseDeadlock: a.s.fsm.ClusterVersion() >= 2,
		SecretHash:     HashSecret(m.Secret), Identity: guard.IdentityOf(ctx),
	}
	if err := a.acquireBudget(ctx, m, cmd); err != nil {
		return nil, err
	}
	if err := fsm.ValidateAcquire(cmd); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	if m.Wait {
		done, err := a.s.guard.StartWait(ctx)
		if err != nil {
			return nil, err
		}
		defer done()
	}
	// Taken before the proposal: a leadership change after it ends the
	// wait (see await).
	changed := a.s.node.LeadershipChanges()
	proposed := wallclock.Now() // recorded in the lock table (queued or granted at): wall time
	cmd.TimeUnixNano = proposed.UnixNano()
	r, err := a.propose(fsm.CmdAcquire, cmd)
	if err == nil && r.Status == fsm.StatusGranted {
		resp := &lockdv1.AcquireResponse{ClusterId: a.clusterID(), Status: lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, Token: r.Token, MaxHold: BudgetPB(r.MaxHold)}
		return connect.NewResponse(resp), nil
	}
	if r != nil && r.Delayed {
		a.s.metrics.lock.DelayHits.Inc()
	}
	if err != nil {
		return nil, err
	}
	resp := &lockdv1.AcquireResponse{ClusterId: a.clusterID()}
	// The wait began when the request first queued (a repeat of the same
	// request finds that time); if it was already granted or dropped when
	// Apply answered (a repeat), it began at this proposal.
	if queuedAt = r.QueuedAt; queuedAt.IsZero() {
		queuedAt = proposed
	}
	// Queued (now or by the first attempt of this request).
	if err := a.await(ctx, node.WaitKey{Session: m.SessionId, Name: m.Name, Seq: m.Seq}, poll, changed, resp); err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// Release gives up a hold.
func (a *api) Release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Release, func() (*connect.Response[lockdv1.ReleaseResponse], error) { return a.release(ctx, req) })
}

func (a *api) release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	r, err := a.propose(fsm.CmdRelease, &fsmv1.Release{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, Token: m.Token, TimeUnixNano: wallclock.Now().UnixNano(),
		SecretHash: HashSecret(m.Secret), Identity: guard.IdentityOf(ctx)})
	if err != nil {
		return nil, err
	}
	if !r.GrantedAt.IsZero() { // not a repeat of a release already applied
		a.s.metrics.lock.HoldEnded(node.EndReleased, r.GrantedAt)
	}
	return connect.NewResponse(&lockdv1.ReleaseResponse{}), nil
}

// Cancel withdraws an Acquire (its wait, or the grant it got).
func (a *api) Cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Cancel, func() (*connect.Response[lockdv1.CancelResponse], error) { return a.cancel(ctx, req) })
}

func (a *api) cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	r, err := a.propose(fsm.CmdCancel, &fsmv1.Cancel{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, AcquireSeq: m.AcquireSeq, TimeUnixNano: wallclock.Now().UnixNano(),
		SecretHash: HashSecret(m.Secret), Identity: guard.IdentityOf(ctx)})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&lockdv1.CancelResponse{Released: r.Released}), nil
}

// Complete releases a hold and leaves a completion mark.
func (a *api) Complete(ctx context.Context, req *connect.Request[lockdv1.CompleteRequest]) (*connect.Response[lockdv1.CompleteResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.Complete, func() (*connect.Response[lockdv1.CompleteResponse], error) { return a.complete(ctx, req) })
}

func (a *api) complete(ctx context.Context, req *connect.Request[lockdv1.CompleteRequest]) (*connect.Response[lockdv1.CompleteResponse], error) {
	m := req.Msg
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	if m.Retention == nil || m.Retention.CheckValid() != nil {
		return nil, a.s.errs.Invalid("retention is required (1s to 400 days)")
	}
	ret := m.Retention.AsDuration()
	cmd := &fsmv1.Complete{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, Token: m.Token,
		RetentionMs: ret.Milliseconds(), TimeUnixNano: wallclock.Now().UnixNano(),
		SecretHash: HashSecret(m.Secret), Identity: guard.IdentityOf(ctx)}
	if ret < time.Second || fsm.ValidateComplete(cmd) != nil { // at least 1s for a new request
		return nil, a.s.errs.Invalid("retention %v is outside [1s, 400 days]", ret)
	}
	r, err := a.propose(fsm.CmdComplete, cmd)
	if err != nil {
		return nil, err
	}
	if !r.GrantedAt.IsZero() { // not a retry of a Complete already applied
		a.s.metrics.lock.HoldEnded(node.EndCompleted, r.GrantedAt)
		a.s.metrics.lock.MarksSet.Inc()
	}
	return connect.NewResponse(&lockdv1.CompleteResponse{}), nil
}

// ForceRelease revokes (or, unsafe, expires) the sessions holding a lock.
func (a *api) ForceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.ForceRelease, func() (*connect.Response[lockdv1.ForceReleaseResponse], error) { return a.forceRelease(ctx, req) })
}

func (a *api) forceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	if err := fsm.ValidateName(req.Msg.Name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	if err := a.read(lockdv1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE); err != nil {
		return nil, err
	}
	l, ok := a.s.fsm.Describe(req.Msg.Name)
	resp := &lockdv1.ForceReleaseResponse{}
	if !ok || len(l.Holders) == 0 {
		return connect.NewResponse(resp), nil
	}
	for _, h := range l.Holders {
		resp.SessionIds = append(resp.SessionIds, h.Session)
	}
	a.s.log.Warn("force release", "lock", req.Msg.Name, "sessions", resp.SessionIds, "unsafe_now", req.Msg.UnsafeNow)
	if req.Msg.UnsafeNow {
		for _, id := range resp.SessionIds {
			if _, err := a.propose(fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: id, TimeUnixNano: wallclock.Now().UnixNano(), Forced: true}); err != nil {
				return nil, err
			}
		}
		return connect.NewResponse(resp), nil
	}
	if _, err := a.propose(fsm.CmdRevokeSession, &fsmv1.RevokeSession{SessionIds: resp.SessionIds, TimeUnixNano: wallclock.Now().UnixNano()}); err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// SetValue replaces the value of a hold (Election.Proclaim).
func (a *api) SetValue(ctx context.Context, req *connect.Request[lockdv1.SetValueRequest]) (*connect.Response[lockdv1.SetValueResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.SetValue, func() (*connect.Response[lockdv1.SetValueResponse], error) {
		m := req.Msg
		if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
			return nil, err
		}
		if err := fsm.ValidateName(m.Name); err != nil {
			return nil, a.s.errs.Invalid("%v", err)
		}
		cmd := &fsmv1.SetValue{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Name: m.Name, Token: m.Token, Value: m.Value,
			SecretHash: HashSecret(m.Secret), Identity: guard.IdentityOf(ctx)}
		if err := fsm.ValidateSetValue(cmd); err != nil {
			return nil, a.s.errs.Invalid("%v", err)
		}
		if _, err := a.propose(fsm.CmdSetValue, cmd); err != nil {
			return nil, err
		}
		return connect.NewResponse(&lockdv1.SetValueResponse{}), nil
	})
}
