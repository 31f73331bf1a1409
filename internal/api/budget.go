package api

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// acquireBudget reads an Acquire request's max_hold and the caller's
// ceiling into cmd.
func (a *api) acquireBudget(ctx context.Context, m *lockdv1.AcquireRequest, cmd *fsmv1.Acquire) error {
	holdMs, err := a.budgetMs(m.MaxHold)
	if err != nil {
		return err
	}
	cmd.MaxHoldMs, cmd.MaxHoldCeilingMs = holdMs, a.s.guard.MaxHold(ctx).Milliseconds()
	return nil
}

// SetLockPolicy sets or removes a lock name's policy (admin).
func (a lockService) SetLockPolicy(ctx context.Context, req *connect.Request[lockdv1.SetLockPolicyRequest]) (*connect.Response[lockdv1.SetLockPolicyResponse], error) {
	return viaLeader(ctx, a.api, req, lockdv1connect.LockServiceClient.SetLockPolicy, func() (*connect.Response[lockdv1.SetLockPolicyResponse], error) {
		m := req.Msg
		cmd := &fsmv1.SetLockPolicy{Name: m.Name, TimeUnixNano: wallclock.Now().UnixNano()}
		if p := m.Policy; p != nil && p.DefaultMaxHold != nil {
			d := p.DefaultMaxHold.AsDuration()
			if p.DefaultMaxHold.CheckValid() != nil || d < 0 {
				return nil, a.s.errs.Invalid("default_max_hold must be a duration from 0 to 720h")
			}
			cmd.DefaultMaxHoldMs = d.Milliseconds()
			if d > 0 && cmd.DefaultMaxHoldMs == 0 {
				cmd.DefaultMaxHoldMs = 1
			}
		}
		if p := m.Policy; p != nil && p.RevokeGrace != nil {
			d := p.RevokeGrace.AsDuration()
			if p.RevokeGrace.CheckValid() != nil || d != 0 && (d < fsm.MinRevokeGraceMs*time.Millisecond || d > fsm.MaxRevokeGraceMs*time.Millisecond) {
				return nil, a.s.errs.Invalid("revoke_grace %v: must be 0 (none) or from 1s to 1h", d)
			}
			cmd.RevokeGraceMs = d.Milliseconds()
		}
		if err := fsm.ValidateSetLockPolicy(cmd); err != nil {
			return nil, a.s.errs.Invalid("%v", err)
		}
		if _, err := a.propose(fsm.CmdSetLockPolicy, cmd); err != nil {
			return nil, err
		}
		a.s.log.Info("lock policy set", "lock", m.Name, "default_max_hold", time.Duration(cmd.DefaultMaxHoldMs)*time.Millisecond,
			"revoke_grace", time.Duration(cmd.RevokeGraceMs)*time.Millisecond)
		return connect.NewResponse(&lockdv1.SetLockPolicyResponse{}), nil
	})
}

// policyPB is a lock's policy for DescribeLock, nil for none.
func (a lockService) policyPB(name string) *lockdv1.LockPolicy {
	p, ok := a.s.fsm.Policy(name)
	if !ok {
		return nil
	}
	return &lockdv1.LockPolicy{DefaultMaxHold: BudgetPB(p.DefaultMaxHold), RevokeGrace: BudgetPB(p.RevokeGrace)}
}
