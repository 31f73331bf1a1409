package lockd

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// transport is a scripted stand-in for one endpoint's transport, used to
// test the client's own logic (deadlines, retries, failover) inside
// synctest bubbles where real sockets cannot go. It is not a lock server:
// lock behaviour is tested against a real one (lockdtest).
type transport struct {
	lockdv1connect.LockServiceClient // methods not scripted panic

	cluster string

	mu    sync.Mutex
	calls []call

	create       func(context.Context, *lockdv1.CreateSessionRequest) (*lockdv1.CreateSessionResponse, error)
	keepAlive    func(context.Context, *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error)
	closeSession func(context.Context, *lockdv1.CloseSessionRequest) (*lockdv1.CloseSessionResponse, error)
	acquire      func(context.Context, *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error)
	cancel       func(context.Context, *lockdv1.CancelRequest) (*lockdv1.CancelResponse, error)
	release      func(context.Context, *lockdv1.ReleaseRequest) (*lockdv1.ReleaseResponse, error)
	forceRelease func(context.Context, *lockdv1.ForceReleaseRequest) (*lockdv1.ForceReleaseResponse, error)
	status       func(context.Context, *lockdv1.StatusRequest) (*lockdv1.StatusResponse, error)
}

type call struct {
	method string
	at     time.Time
	msg    any
}

func (f *transport) record(method string, msg any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{method, time.Now(), msg})
}

// callsOf returns the recorded calls of method.
func (f *transport) callsOf(method string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func respond[Req, Res any](f *transport, name string, ctx context.Context, req *connect.Request[Req],
	fn func(context.Context, *Req) (*Res, error),
) (*connect.Response[Res], error) {
	f.record(name, req.Msg)
	if fn == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New(name+" not scripted"))
	}
	res, err := fn(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func (f *transport) CreateSession(ctx context.Context, req *connect.Request[lockdv1.CreateSessionRequest]) (*connect.Response[lockdv1.CreateSessionResponse], error) {
	fn := f.create
	if fn == nil {
		fn = func(_ context.Context, r *lockdv1.CreateSessionRequest) (*lockdv1.CreateSessionResponse, error) {
			return &lockdv1.CreateSessionResponse{SessionId: "s1", Ttl: r.Ttl, ClusterId: f.cluster}, nil
		}
	}
	return respond(f, "CreateSession", ctx, req, fn)
}

func (f *transport) KeepAlive(ctx context.Context, req *connect.Request[lockdv1.KeepAliveRequest]) (*connect.Response[lockdv1.KeepAliveResponse], error) {
	return respond(f, "KeepAlive", ctx, req, f.keepAlive)
}

func (f *transport) CloseSession(ctx context.Context, req *connect.Request[lockdv1.CloseSessionRequest]) (*connect.Response[lockdv1.CloseSessionResponse], error) {
	fn := f.closeSession
	if fn == nil {
		fn = func(context.Context, *lockdv1.CloseSessionRequest) (*lockdv1.CloseSessionResponse, error) {
			return &lockdv1.CloseSessionResponse{}, nil
		}
	}
	return respond(f, "CloseSession", ctx, req, fn)
}

func (f *transport) Acquire(ctx context.Context, req *connect.Request[lockdv1.AcquireRequest]) (*connect.Response[lockdv1.AcquireResponse], error) {
	return respond(f, "Acquire", ctx, req, f.acquire)
}

func (f *transport) Cancel(ctx context.Context, req *connect.Request[lockdv1.CancelRequest]) (*connect.Response[lockdv1.CancelResponse], error) {
	return respond(f, "Cancel", ctx, req, f.cancel)
}

func (f *transport) Release(ctx context.Context, req *connect.Request[lockdv1.ReleaseRequest]) (*connect.Response[lockdv1.ReleaseResponse], error) {
	return respond(f, "Release", ctx, req, f.release)
}

func (f *transport) ForceRelease(ctx context.Context, req *connect.Request[lockdv1.ForceReleaseRequest]) (*connect.Response[lockdv1.ForceReleaseResponse], error) {
	return respond(f, "ForceRelease", ctx, req, f.forceRelease)
}

func (f *transport) Status(ctx context.Context, req *connect.Request[lockdv1.StatusRequest]) (*connect.Response[lockdv1.StatusResponse], error) {
	return respond(f, "Status", ctx, req, f.status)
}

// okKeepAlive confirms every KeepAlive with ttl.
func okKeepAlive(ttl time.Duration) func(context.Context, *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
	return func(context.Context, *lockdv1.KeepAliveRequest) (*lockdv1.KeepAliveResponse, error) {
		return &lockdv1.KeepAliveResponse{Ttl: durationpb.New(ttl)}, nil
	}
}

// apiError builds an error as the server sends it: a Connect code plus an
// ErrorDetail with a reason.
func apiError(code connect.Code, reason lockdv1.ErrorReason, edit ...func(*lockdv1.ErrorDetail)) error {
	e := connect.NewError(code, errors.New("scripted "+reason.String()))
	d := &lockdv1.ErrorDetail{Reason: reason}
	for _, f := range edit {
		f(d)
	}
	det, err := connect.NewErrorDetail(d)
	if err != nil {
		panic(err)
	}
	e.AddDetail(det)
	return e
}

var errConnRefused = connect.NewError(connect.CodeUnavailable, errors.New("dial tcp: connection refused"))

// newTestClient returns a Client whose endpoints use the given transports,
// named http://ep0:7070, http://ep1:7070, ...
func newTestClient(t testing.TB, ts []*transport, opts ...Option) *Client {
	t.Helper()
	urls := make([]string, len(ts))
	for i := range ts {
		urls[i] = "ep" + string(rune('0'+i))
	}
	// The fakes replace the unary clients: no stream.
	c, err := New(append([]Option{WithEndpoints(urls...), WithStream(false)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	for i, ep := range c.eps.All() {
		ep.Svc = ts[i]
	}
	c.eps.SetCurrent(0) // not a random endpoint: the tests script the order
	return c
}

var netOpErr = net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
