package lockd

import (
	"context"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

func (s *service) ClearMark(ctx context.Context, req *connect.Request[lockdv1.ClearMarkRequest]) (*connect.Response[lockdv1.ClearMarkResponse], error) {
	return raw(ctx, s.c, rpcClearMark, req)
}
