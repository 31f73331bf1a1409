package api

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Explain returns a lock's holders and waiters and the chain of what each
// holder itself waits for, across locks (internal/fsm, deadlock.go).
func (a lockService) Explain(ctx context.Context, req *connect.Request[lockdv1.ExplainRequest]) (*connect.Response[lockdv1.ExplainResponse], error) {
	if req.Msg.Consistency == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return a.explain(req.Msg)
	}
	return viaLeader(ctx, a.api, req, lockdv1connect.LockServiceClient.Explain, func() (*connect.Response[lockdv1.ExplainResponse], error) { return a.explain(req.Msg) })
}

func (a lockService) explain(m *lockdv1.ExplainRequest) (*connect.Response[lockdv1.ExplainResponse], error) {
	if err := fsm.ValidateName(m.Name); err != nil {
		return nil, a.s.errs.Invalid("%v", err)
	}
	if err := a.read(m.Consistency); err != nil {
		return nil, err
	}
	resp := &lockdv1.ExplainResponse{}
	l, chain, truncated, ok := a.s.fsm.Explain(m.Name)
	if ok {
		resp.Lock, resp.Truncated = LockPB(l), truncated
		for _, st := range chain {
			resp.Chain = append(resp.Chain, &lockdv1.WaitStep{Depth: uint32(st.Depth), SessionId: st.Session, Owner: st.Owner, Lock: st.Lock,
				BlockedBy: st.BlockedBy, BlockedByOwner: st.BlockedByOwner, Holding: st.Holding, QueuedAt: timestamppb.New(st.QueuedAt), Cycle: st.Cycle})
		}
	}
	return connect.NewResponse(resp), nil
}
