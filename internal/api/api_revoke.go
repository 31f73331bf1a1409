package api

import (
	"context"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/rpcs"
	"github.com/lockd-dev/lockd/internal/wallclock"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// RequestRelease asks a lock's holders to let go: one watch event per hold
// (internal/fsm, revoke.go), recorded on each hold. A caller with admin
// permission on the lock (everyone with authentication off, as for
// ForceRelease) also starts the lock policy's revoke grace on each hold not
// already given one: the leader's timer (internal/node, revoke.go) then
// revokes the holder's session unless the hold ends first.
func (a lockService) RequestRelease(ctx context.Context, req *connect.Request[lockdv1.RequestReleaseRequest]) (*connect.Response[lockdv1.RequestReleaseResponse], error) {
	return viaLeader(ctx, a.api, req, lockdv1connect.LockServiceClient.RequestRelease, func() (*connect.Response[lockdv1.RequestReleaseResponse], error) {
		m := req.Msg
		cmd := &fsmv1.RequestRelease{Name: m.Name, Reason: m.Reason, Identity: guard.IdentityOf(ctx), TimeUnixNano: wallclock.Now().UnixNano(),
			Admin: a.s.guard.May(ctx, rpcs.Admin, m.Name)}
		if err := fsm.ValidateRequestRelease(cmd); err != nil {
			return nil, a.s.errs.Invalid("%v", err)
		}
		r, err := a.propose(fsm.CmdRequestRelease, cmd)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&lockdv1.RequestReleaseResponse{Holders: uint32(len(r.Holders)), RevokeGrace: BudgetPB(r.MaxHold)}), nil
	})
}
