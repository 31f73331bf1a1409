package lockd

import (
	"context"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// ClearMark is resent after an unknown outcome only when it names the
// mark's token: without one, a resend could clear a mark set since (the
// job's next run).
var rpcClearMark = rpc[lockdv1.ClearMarkRequest, lockdv1.ClearMarkResponse]{
	call:       onLock(lockdv1connect.LockServiceClient.ClearMark),
	idempotent: func(m *lockdv1.ClearMarkRequest) bool { return m.GetToken() != 0 },
	name:       lockName[lockdv1.ClearMarkRequest],
}

func (s *service) ClearMark(ctx context.Context, req *connect.Request[lockdv1.ClearMarkRequest]) (*connect.Response[lockdv1.ClearMarkResponse], error) {
	return raw(ctx, s.c, rpcClearMark, req)
}
