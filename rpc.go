package lockd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"

	"github.com/lockd-dev/lockd/internal/wire"
)

// maxLongPoll is how long one queued Acquire blocks on the server before
// the client repeats it: below the server's default cap (30 s) and common
// proxy timeouts. The client always sends an explicit poll time no longer
// than this, so it knows how long an attempt may take.
const maxLongPoll = 25 * time.Second

// rpc is how the client calls one method: the generated client's method,
// and the method's row of the table shared with the server
// (internal/rpcs: whether a resend after an unknown outcome is safe, which
// field names the lock, the stream frame that carries it).
type rpc[Req, Res any] struct {
	call func(*wire.Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)
	m    *rpcs.Method
	// maxPoll is the longest long poll a request may ask the server for
	// (Acquire with wait); an attempt's time is its request time plus the
	// poll.
	maxPoll time.Duration
}

// row returns the client's row of the method whose request is Req.
func row[Req, Res any](call func(*wire.Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) rpc[Req, Res] {
	m := rpcs.For(any(new(Req)).(proto.Message))
	if m == nil {
		panic(fmt.Sprintf("lockd: %T has no row in the method table", new(Req)))
	}
	return rpc[Req, Res]{call: call, m: m}
}

// onLock and onCluster adapt a method of the generated clients to a row.

func onLock[Req, Res any](m func(lockdv1connect.LockServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) func(*wire.Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
	return func(ep *wire.Node, ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
		return m(ep.Unary(), ctx, r)
	}
}

func onCluster[Req, Res any](m func(lockdv1connect.ClusterServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) func(*wire.Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
	return func(ep *wire.Node, ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
		return m(ep.Cluster, ctx, r)
	}
}

// The methods the client calls.
var (
	rpcCreateSession      = row(onLock(lockdv1connect.LockServiceClient.CreateSession))
	rpcKeepAlive          = row(onLock(lockdv1connect.LockServiceClient.KeepAlive))
	rpcCloseSession       = row(onLock(lockdv1connect.LockServiceClient.CloseSession))
	rpcListSessions       = row(onLock(lockdv1connect.LockServiceClient.ListSessions))
	rpcAcquire            = withPoll(row(onLock(lockdv1connect.LockServiceClient.Acquire)), maxLongPoll)
	rpcRelease            = row(onLock(lockdv1connect.LockServiceClient.Release))
	rpcCancel             = row(onLock(lockdv1connect.LockServiceClient.Cancel))
	rpcComplete           = row(onLock(lockdv1connect.LockServiceClient.Complete))
	rpcSetValue           = row(onLock(lockdv1connect.LockServiceClient.SetValue))
	rpcCheckToken         = row(onLock(lockdv1connect.LockServiceClient.CheckToken))
	rpcDescribeLock       = row(onLock(lockdv1connect.LockServiceClient.DescribeLock))
	rpcListLocks          = row(onLock(lockdv1connect.LockServiceClient.ListLocks))
	rpcForceRelease       = row(onLock(lockdv1connect.LockServiceClient.ForceRelease))
	rpcClearMark          = row(onLock(lockdv1connect.LockServiceClient.ClearMark))
	rpcStatus             = row(onLock(lockdv1connect.LockServiceClient.Status))
	rpcJoin               = row(onCluster(lockdv1connect.ClusterServiceClient.Join))
	rpcRemoveMember       = row(onCluster(lockdv1connect.ClusterServiceClient.RemoveMember))
	rpcTransferLeadership = row(onCluster(lockdv1connect.ClusterServiceClient.TransferLeadership))
)

func withPoll[Req, Res any](r rpc[Req, Res], poll time.Duration) rpc[Req, Res] {
	r.maxPoll = poll
	return r
}

// name returns the lock a request names, for error messages.
func (r rpc[Req, Res]) name(msg *Req) string {
	if r.m.Subject != "name" {
		return ""
	}
	return r.m.SubjectOf(any(msg).(proto.Message))
}

// streamed reports whether the method's request goes over the session
// stream as a frame of its own (KeepAlive's frame is a batch, sent by
// keepalive.go).
func (r rpc[Req, Res]) streamed() bool { return r.m.Frame != "" && r.m.FrameRequest == "" }

// policyOf returns the retry policy of a request under its table row.
func (r rpc[Req, Res]) policyOf(msg *Req) wire.Policy {
	return wire.Policy{Idempotent: r.m.Idempotent(any(msg).(proto.Message))}
}

// invoke calls the method with msg through the retry loop under policy p
// and checks the cluster id of every answer.
func (r rpc[Req, Res]) invoke(ctx context.Context, c *Client, p wire.Policy, msg *Req, hdr http.Header) (*connect.Response[Res], error) {
	var resp *connect.Response[Res]
	err := c.call.Do(ctx, p, r.name(msg), func(ctx context.Context, ep *wire.Node) error {
		req := connect.NewRequest(msg)
		for k, v := range hdr {
			req.Header()[k] = v
		}
		res, err := r.send(ctx, c, ep, req)
		if err != nil {
			id := ""
			if d := wire.ErrorDetail(err); d != nil {
				id = d.GetClusterId()
			}
			var ce *connect.Error
			if id == "" && errors.As(err, &ce) {
				id = ce.Meta().Get(endpoint.ClusterIDHeader)
			}
			if cerr := c.eps.CheckCluster(ep, id); cerr != nil {
				return cerr
			}
			return err
		}
		id := res.Header().Get(endpoint.ClusterIDHeader)
		if m, ok := any(res.Msg).(interface{ GetClusterId() string }); ok && m.GetClusterId() != "" {
			id = m.GetClusterId()
		}
		if err := c.eps.CheckCluster(ep, id); err != nil {
			return err
		}
		resp = res
		return nil
	})
	return resp, err
}

// send makes one attempt: over ep's session stream when the row has a
// stream form and the stream is on (and no extra headers are to be sent),
// else unary.
func (r rpc[Req, Res]) send(ctx context.Context, c *Client, ep *wire.Node, req *connect.Request[Req]) (*connect.Response[Res], error) {
	if r.streamed() && c.cfg.stream && len(req.Header()) == 0 {
		res, err := wire.CallStream[Req, Res](ctx, c.call, ep, r.m, req.Msg)
		if !errors.Is(err, wire.ErrNoStream) {
			return res, err
		}
	}
	return r.call(ep, ctx, req)
}
