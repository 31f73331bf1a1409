package api

import (
	"context"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/node"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// AcquireMany takes a set of locks all at once, or queues one request on
// every one of them (internal/fsm, many.go), blocking up to the poll
// timeout like Acquire.
func (a lockService) AcquireMany(ctx context.Context, req *connect.Request[lockdv1.AcquireManyRequest]) (*connect.Response[lockdv1.AcquireManyResponse], error) {
	return viaLeader(ctx, a.api, req, lockdv1connect.LockServiceClient.AcquireMany, func() (*connect.Response[lockdv1.AcquireManyResponse], error) {
		return a.acquireMany(ctx, req.Msg)
	})
}

func (a lockService) acquireMany(ctx context.Context, m *lockdv1.AcquireManyRequest) (*connect.Response[lockdv1.AcquireManyResponse], error) {
	if err := a.checkRequest(m.SessionId, m.Seq); err != nil {
		return nil, err
	}
	cmd := &fsmv1.AcquireMany{SessionId: m.SessionId, Seq: m.Seq, Ack: m.Ack, Wait: m.Wait, Value: m.Value,
		SecretHash: HashSecret(m.Secret), Identity: guard.IdentityOf(ctx)}
	for _, l := range m.Locks {
		mode := int32(l.Mode)
		if l.Mode == lockdv1.Mode_MODE_UNSPECIFIED {
			mode = fsm.ModeExclusive
		}
		cmd.Locks = append(cmd.Locks, &fsmv1.ManyLock{Name: l.Name, Mode: mode, Limit: l.Limit})
	}
	poll := a.s.cfg.MaxPollTimeout
	if m.PollTimeout != nil {
		if err := m.PollTimeout.CheckValid(); err != nil || m.PollTimeout.AsDuration() < 0 {
			return nil, a.s.errs.Invalid("poll_timeout must be a non-negative duration")
		}
		poll = min(poll, m.PollTimeout.AsDuration())
	}
	holdMs, err := a.budgetMs(m.MaxHold)
	if err != nil {
		return nil, err
	}
	cmd.MaxHoldMs, cmd.MaxHoldCeilingMs = holdMs, a.s.guard.MaxHold(ctx).Milliseconds()
	if err := fsm.ValidateAcquireMany(cmd); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	for _, l := range cmd.Locks {
		if err := a.s.guard.CheckLock(ctx, "AcquireMany", l.Name); err != nil {
			return nil, err
		}
	}
	if m.Wait {
		done, err := a.s.guard.StartWait(ctx)
		if err != nil {
			return nil, err
		}
		defer done()
	}
	changed := a.s.node.LeadershipChanges()
	cmd.TimeUnixNano = wallclock.Now().UnixNano()
	r, err := a.propose(fsm.CmdAcquireMany, cmd)
	if err != nil {
		return nil, err
	}
	// The FSM answers in name order; the client gets the request's order.
	names := make([]string, len(cmd.Locks))
	for i, l := range cmd.Locks {
		names[i] = l.Name
	}
	sorted := slices.Sorted(slices.Values(names))
	resp := &lockdv1.AcquireManyResponse{ClusterId: a.clusterID()}
	if r.Status == fsm.StatusGranted {
		if len(r.Tokens) != len(sorted) {
			// A repeat of a set granted earlier whose holds have ended
			// since (released, or a hold budget ran out).
			return nil, a.s.errs.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_NOT_HELD, "the set was granted, and its holds have ended since")
		}
		resp.Status, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, BudgetPB(r.MaxHold)
		resp.Grants = grantsPB(names, sorted, r.Tokens)
		return connect.NewResponse(resp), nil
	}
	// Queued (now or by the first attempt): every lock of the set is
	// granted in the same entry, so the first one's grant tells.
	one := &lockdv1.AcquireResponse{}
	if err := a.await(ctx, node.WaitKey{Session: m.SessionId, Name: sorted[0], Seq: m.Seq}, poll, changed, one); err != nil {
		return nil, err
	}
	if one.Status != lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED {
		resp.Status, resp.Position = one.Status, one.Position
		return connect.NewResponse(resp), nil
	}
	tokens, budget, ok := a.s.fsm.HeldBySeq(m.SessionId, m.Seq, sorted)
	if !ok {
		return nil, a.s.errs.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_NOT_HELD, "the set was granted, and its holds have ended since")
	}
	resp.Status, resp.MaxHold = lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED, BudgetPB(budget)
	resp.Grants = grantsPB(names, sorted, tokens)
	return connect.NewResponse(resp), nil
}

// grantsPB lists the tokens (in sorted's order) in the request's order.
func grantsPB(names, sorted []string, tokens []uint64) []*lockdv1.LockGrant {
	out := make([]*lockdv1.LockGrant, len(names))
	for i, n := range names {
		j, _ := slices.BinarySearchFunc(sorted, n, strings.Compare)
		out[i] = &lockdv1.LockGrant{Name: n, Token: tokens[j]}
	}
	return out
}

// budgetMs reads a request's max_hold in the log's milliseconds.
func (a *api) budgetMs(d *durationpb.Duration) (int64, error) {
	if d == nil {
		return 0, nil
	}
	v := d.AsDuration()
	if d.CheckValid() != nil || v < 0 || v > fsm.MaxHoldMs*time.Millisecond {
		return 0, a.s.errs.Invalid("max_hold must be a duration from 0 to 720h")
	}
	if v > 0 && v < time.Millisecond {
		v = time.Millisecond // never 0 (none) for a budget asked
	}
	return v.Milliseconds(), nil
}
