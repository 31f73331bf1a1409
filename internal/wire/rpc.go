package wire

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/rpcs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// maxLongPoll is how long one queued Acquire blocks on the server before
// the client repeats it: below the server's default cap (30 s) and common
// proxy timeouts. The client always sends an explicit poll time no longer
// than this, so it knows how long an attempt may take.
const maxLongPoll = 25 * time.Second

// RPC is how the client calls one method: the generated client's method,
// and the method's row of the table shared with the server
// (internal/rpcs: whether a resend after an unknown outcome is safe, which
// field names the lock, the stream frame that carries it).
type RPC[Req, Res any] struct {
	call func(*Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)
	m    *rpcs.Method
	// idem and subject read the row's facts from a request without
	// protobuf reflection, resolved once per method (readersOf).
	idem    func(*Req) bool
	subject func(*Req) string
	// MaxPoll is the longest long poll a request may ask the server for
	// (Acquire with wait); an attempt's time is its request time plus the
	// poll.
	MaxPoll time.Duration
}

// row returns the client's row of the method whose request is Req.
func row[Req, Res any](call func(*Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) RPC[Req, Res] {
	m := rpcs.For(any(new(Req)).(proto.Message))
	if m == nil {
		panic(fmt.Sprintf("lockd: %T has no row in the method table", new(Req)))
	}
	idem, subject := readersOf[Req](m)
	return RPC[Req, Res]{call: call, m: m, idem: idem, subject: subject}
}

// onLock and onCluster adapt a method of the generated clients to a row.

func onLock[Req, Res any](m func(lockdv1connect.LockServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) func(*Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
	return func(ep *Node, ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
		return m(ep.Unary(), ctx, r)
	}
}

func onCluster[Req, Res any](m func(lockdv1connect.ClusterServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) func(*Node, context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
	return func(ep *Node, ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
		return m(ep.Cluster, ctx, r)
	}
}

// The methods the client calls.
var (
	CreateSession      = row(onLock(lockdv1connect.LockServiceClient.CreateSession))
	KeepAlive          = row(onLock(lockdv1connect.LockServiceClient.KeepAlive))
	CloseSession       = row(onLock(lockdv1connect.LockServiceClient.CloseSession))
	ListSessions       = row(onLock(lockdv1connect.LockServiceClient.ListSessions))
	Acquire            = withPoll(row(onLock(lockdv1connect.LockServiceClient.Acquire)), maxLongPoll)
	Release            = row(onLock(lockdv1connect.LockServiceClient.Release))
	Cancel             = row(onLock(lockdv1connect.LockServiceClient.Cancel))
	Complete           = row(onLock(lockdv1connect.LockServiceClient.Complete))
	SetValue           = row(onLock(lockdv1connect.LockServiceClient.SetValue))
	CheckToken         = row(onLock(lockdv1connect.LockServiceClient.CheckToken))
	DescribeLock       = row(onLock(lockdv1connect.LockServiceClient.DescribeLock))
	ListLocks          = row(onLock(lockdv1connect.LockServiceClient.ListLocks))
	ForceRelease       = row(onLock(lockdv1connect.LockServiceClient.ForceRelease))
	ClearMark          = row(onLock(lockdv1connect.LockServiceClient.ClearMark))
	SetLockPolicy      = row(onLock(lockdv1connect.LockServiceClient.SetLockPolicy))
	RequestRelease     = row(onLock(lockdv1connect.LockServiceClient.RequestRelease))
	Explain            = row(onLock(lockdv1connect.LockServiceClient.Explain))
	AcquireMany        = withPoll(row(onLock(lockdv1connect.LockServiceClient.AcquireMany)), maxLongPoll)
	Status             = row(onLock(lockdv1connect.LockServiceClient.Status))
	Join               = row(onCluster(lockdv1connect.ClusterServiceClient.Join))
	RemoveMember       = row(onCluster(lockdv1connect.ClusterServiceClient.RemoveMember))
	TransferLeadership = row(onCluster(lockdv1connect.ClusterServiceClient.TransferLeadership))
)

func withPoll[Req, Res any](r RPC[Req, Res], poll time.Duration) RPC[Req, Res] {
	r.MaxPoll = poll
	return r
}

// name returns the lock a request names, for error messages.
func (r RPC[Req, Res]) name(msg *Req) string {
	return r.subject(msg)
}

// streamed reports whether the method's request goes over the session
// stream as a frame of its own (KeepAlive's frame is a batch, sent by
// KAScheduler).
func (r RPC[Req, Res]) streamed() bool { return r.m.Frame != "" && r.m.FrameRequest == "" }

// PolicyOf returns the retry policy of a request under its table row.
func (r RPC[Req, Res]) PolicyOf(msg *Req) Policy {
	return Policy{Idempotent: r.idem(msg)}
}

// Invoke calls the method with msg through the retry loop under policy p
// and checks the cluster id of every answer. An answer that came over the
// session stream carries the cluster id in its header, as a unary one
// does.
func (r RPC[Req, Res]) Invoke(ctx context.Context, c *Caller, p Policy, msg *Req, hdr http.Header) (*connect.Response[Res], error) {
	resp, res, id, err := r.invoke(ctx, c, p, msg, hdr)
	if err != nil || resp != nil {
		return resp, err
	}
	resp = connect.NewResponse(res)
	if id != "" {
		resp.Header().Set(endpoint.ClusterIDHeader, id)
	}
	return resp, nil
}

// Call is Invoke for the client's own calls, which read only the answer:
// it builds no response or header for an answer that came over the
// session stream.
func (r RPC[Req, Res]) Call(ctx context.Context, c *Caller, p Policy, msg *Req) (*Res, error) {
	resp, res, _, err := r.invoke(ctx, c, p, msg, nil)
	if err != nil {
		return nil, err
	}
	if resp != nil {
		return resp.Msg, nil
	}
	return res, nil
}

// invoke runs the retry loop; the answer is resp (unary), or res and the
// cluster id it came with (over the stream).
func (r RPC[Req, Res]) invoke(ctx context.Context, c *Caller, p Policy, msg *Req, hdr http.Header) (resp *connect.Response[Res], res *Res, cluster string, err error) {
	err = c.Do(ctx, p, r.name(msg), func(ctx context.Context, ep *Node) error {
		if r.streamed() && c.Stream && len(hdr) == 0 {
			sres, id, err := CallStream[Req, Res](ctx, c, ep, r.m, msg)
			if !errors.Is(err, ErrNoStream) {
				if err == nil {
					if m, ok := any(sres).(interface{ GetClusterId() string }); ok && m.GetClusterId() != "" {
						id = m.GetClusterId()
					}
					if cerr := c.Eps.CheckCluster(ep, id); cerr != nil {
						return cerr
					}
					resp, res, cluster = nil, sres, id
					return nil
				}
				return r.checkFailed(c, ep, err)
			}
		}
		req := connect.NewRequest(msg)
		for k, v := range hdr {
			req.Header()[k] = v
		}
		ures, err := r.call(ep, ctx, req)
		if err != nil {
			// The cluster id of a failed attempt is in its error.
			return r.checkFailed(c, ep, err)
		}
		id := ures.Header().Get(endpoint.ClusterIDHeader)
		if m, ok := any(ures.Msg).(interface{ GetClusterId() string }); ok && m.GetClusterId() != "" {
			id = m.GetClusterId()
		}
		if err := c.Eps.CheckCluster(ep, id); err != nil {
			return err
		}
		resp, res, cluster = ures, nil, ""
		return nil
	})
	return resp, res, cluster, err
}

// checkFailed checks the cluster id of a failed attempt's error: another
// cluster's answer is ErrClusterMismatch, whatever it says.
func (r RPC[Req, Res]) checkFailed(c *Caller, ep *Node, err error) error {
	id := ""
	if d := ErrorDetail(err); d != nil {
		id = d.GetClusterId()
	}
	var ce *connect.Error
	if id == "" && errors.As(err, &ce) {
		id = ce.Meta().Get(endpoint.ClusterIDHeader)
	}
	if cerr := c.Eps.CheckCluster(ep, id); cerr != nil {
		return cerr
	}
	return err
}

// service is the raw API behind lockd's Client.Service: every method goes through
// the client's failover, retry and cluster-id checks, under its row of the
// method table (internal/rpcs).
type service struct{ c *Caller }

var _ lockdv1connect.LockServiceClient = (*service)(nil)

// raw calls a method of the raw API under its table row.
func raw[Req, Res any](ctx context.Context, c *Caller, r RPC[Req, Res], req *connect.Request[Req]) (*connect.Response[Res], error) {
	return r.Invoke(ctx, c, r.PolicyOf(req.Msg), req.Msg, req.Header())
}

func (s *service) CreateSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	return raw(ctx, s.c, CreateSession, req)
}

func (s *service) KeepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	return raw(ctx, s.c, KeepAlive, req)
}

func (s *service) CloseSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	return raw(ctx, s.c, CloseSession, req)
}

func (s *service) ListSessions(ctx context.Context, req *connect.Request[lockdv1.ListSessionsRequest]) (*connect.Response[lockdv1.ListSessionsResponse], error) {
	return raw(ctx, s.c, ListSessions, req)
}

// Acquire sends a waiting acquire with a poll time of at most the policy
// table's long-poll cap (25 s), so that each attempt's time is known
// whatever the server's own cap.
func (s *service) Acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (*connect.Response[lockdv1.AcquireResponse], error) {
	m := req.Msg
	p := Acquire.PolicyOf(m)
	if pt := m.GetPollTimeout(); m.GetWait() && (pt == nil || pt.IsValid() && pt.AsDuration() >= 0) {
		p.Poll = Acquire.MaxPoll
		if pt != nil {
			p.Poll = min(pt.AsDuration(), Acquire.MaxPoll)
		}
		if pt == nil || pt.AsDuration() != p.Poll {
			m = proto.CloneOf(m)
			m.PollTimeout = durationpb.New(p.Poll)
		}
	}
	return Acquire.Invoke(ctx, s.c, p, m, req.Header())
}

func (s *service) Release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	return raw(ctx, s.c, Release, req)
}

func (s *service) Cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	return raw(ctx, s.c, Cancel, req)
}

func (s *service) CheckToken(ctx context.Context, req *connect.Request[lockdv1.CheckTokenRequest]) (*connect.Response[lockdv1.CheckTokenResponse], error) {
	return raw(ctx, s.c, CheckToken, req)
}

func (s *service) DescribeLock(ctx context.Context, req *connect.Request[lockdv1.DescribeLockRequest]) (*connect.Response[lockdv1.DescribeLockResponse], error) {
	return raw(ctx, s.c, DescribeLock, req)
}

func (s *service) ListLocks(ctx context.Context, req *connect.Request[lockdv1.ListLocksRequest]) (*connect.Response[lockdv1.ListLocksResponse], error) {
	return raw(ctx, s.c, ListLocks, req)
}

func (s *service) ForceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	return raw(ctx, s.c, ForceRelease, req)
}

func (s *service) Complete(ctx context.Context, req *connect.Request[lockdv1.CompleteRequest]) (*connect.Response[lockdv1.CompleteResponse], error) {
	return raw(ctx, s.c, Complete, req)
}

func (s *service) Status(ctx context.Context, req *connect.Request[lockdv1.StatusRequest]) (*connect.Response[lockdv1.StatusResponse], error) {
	return raw(ctx, s.c, Status, req)
}

// clusterService is the raw membership API behind lockd's Client.ClusterService.
type clusterService struct{ c *Caller }

var _ lockdv1connect.ClusterServiceClient = (*clusterService)(nil)

func (s *clusterService) Join(ctx context.Context, req *connect.Request[lockdv1.JoinRequest]) (*connect.Response[lockdv1.JoinResponse], error) {
	return raw(ctx, s.c, Join, req)
}

func (s *clusterService) RemoveMember(ctx context.Context, req *connect.Request[lockdv1.RemoveMemberRequest]) (*connect.Response[lockdv1.RemoveMemberResponse], error) {
	return raw(ctx, s.c, RemoveMember, req)
}

func (s *clusterService) TransferLeadership(ctx context.Context, req *connect.Request[lockdv1.TransferLeadershipRequest]) (*connect.Response[lockdv1.TransferLeadershipResponse], error) {
	return raw(ctx, s.c, TransferLeadership, req)
}

func (s *service) SetValue(ctx context.Context, req *connect.Request[lockdv1.SetValueRequest]) (*connect.Response[lockdv1.SetValueResponse], error) {
	return raw(ctx, s.c, SetValue, req)
}

func (s *service) ClearMark(ctx context.Context, req *connect.Request[lockdv1.ClearMarkRequest]) (*connect.Response[lockdv1.ClearMarkResponse], error) {
	return raw(ctx, s.c, ClearMark, req)
}

func (s *service) SetLockPolicy(ctx context.Context, req *connect.Request[lockdv1.SetLockPolicyRequest]) (*connect.Response[lockdv1.SetLockPolicyResponse], error) {
	return raw(ctx, s.c, SetLockPolicy, req)
}

func (s *service) AcquireMany(ctx context.Context, req *connect.Request[lockdv1.AcquireManyRequest]) (*connect.Response[lockdv1.AcquireManyResponse], error) {
	return raw(ctx, s.c, AcquireMany, req)
}

func (s *service) Explain(ctx context.Context, req *connect.Request[lockdv1.ExplainRequest]) (*connect.Response[lockdv1.ExplainResponse], error) {
	return raw(ctx, s.c, Explain, req)
}

func (s *service) RequestRelease(ctx context.Context, req *connect.Request[lockdv1.RequestReleaseRequest]) (*connect.Response[lockdv1.RequestReleaseResponse], error) {
	return raw(ctx, s.c, RequestRelease, req)
}

// NewService returns the raw API over c (lockd's Client.Service).
func NewService(c *Caller) lockdv1connect.LockServiceClient { return &service{c: c} }

// NewClusterService returns the raw membership API over c (lockd's
// Client.ClusterService).
func NewClusterService(c *Caller) lockdv1connect.ClusterServiceClient { return &clusterService{c: c} }
