package api

import (
	"context"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// ClearMark (admin) ends a completion mark before its retention runs out.
func (a *api) ClearMark(ctx context.Context, req *connect.Request[lockdv1.ClearMarkRequest]) (*connect.Response[lockdv1.ClearMarkResponse], error) {
	return viaLeader(ctx, a, req, lockdv1connect.LockServiceClient.ClearMark, func() (*connect.Response[lockdv1.ClearMarkResponse], error) { return a.clearMark(ctx, req) })
}

// clearMark proposes the same ClearMark command the leader's retention
// timer proposes, naming the mark's token, with no term: Apply clears the
// mark only if it is still the one read here, so a mark set after this
// read (a later run of the job) is never cleared by mistake. The marks
// manager drops its timer when the mark goes (its EventMarkCleared).
func (a *api) clearMark(ctx context.Context, req *connect.Request[lockdv1.ClearMarkRequest]) (*connect.Response[lockdv1.ClearMarkResponse], error) {
	name := req.Msg.Name
	if err := fsm.ValidateName(name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	if err := a.read(lockdv1.ReadConsistency_READ_CONSISTENCY_LINEARIZABLE); err != nil {
		return nil, err
	}
	l, ok := a.s.fsm.Describe(name)
	resp := &lockdv1.ClearMarkResponse{}
	if !ok || l.Mark == nil || req.Msg.Token != 0 && l.Mark.Token != req.Msg.Token {
		return connect.NewResponse(resp), nil
	}
	m := *l.Mark
	if _, err := a.propose(fsm.CmdClearMark, &fsmv1.ClearMark{Name: name, Token: m.Token}); err != nil {
		return nil, err
	}
	a.s.log.Warn("completion mark cleared by admin", "lock", name, "token", m.Token)
	resp.Mark = MarkPB(m)
	return connect.NewResponse(resp), nil
}
