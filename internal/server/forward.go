package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/guard"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// ForwardedHeader marks a request a follower forwarded to the leader. A node
// never forwards such a request again, so a stale view of the leader cannot
// make requests loop.
const ForwardedHeader = guard.ForwardedHeader

// ForwardedIdentityHeader carries the original caller's identity on a call
// a follower forwards to the leader (see internal/guard).
const ForwardedIdentityHeader = guard.ForwardedIdentityHeader

// forwarder holds Connect clients to other nodes' APIs, for forwarding
// writes and linearizable reads to the leader.
type forwarder struct {
	hc   *http.Client
	opts []connect.ClientOption // the peer token, when set

	mu      sync.Mutex
	lock    map[string]lockdv1connect.LockServiceClient
	cluster map[string]lockdv1connect.ClusterServiceClient
	moved   chan struct{} // closed and replaced when this node sees the leader change
}

// leaderMoved returns a channel closed at the next leader change this node
// observes (a follower's view included: the leader it forwards to).
func (f *forwarder) leaderMoved() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.moved
}

// leaderChanged ends the forwards in flight: they went to a leader this
// node no longer follows (countLeaderChanges calls it on every Raft leader
// observation).
func (f *forwarder) leaderChanged() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.moved)
	f.moved = make(chan struct{})
}

// newForwarder returns a forwarder that uses hc, or its own transport
// when hc is nil: over TLS with the node's certificate when store is not
// nil, every new connection with the current files and only to a node
// whose certificate is a member's (certs.Store.DialPeer). Its every call to
// another node (a forward, a join, a catch-up poll) presents peerToken,
// when set.
func newForwarder(hc *http.Client, store *certs.Store, peerToken string) *forwarder {
	if hc == nil {
		// HTTP/1.1 with a deep keep-alive pool: on loopback it costs about
		// half the CPU per request of h2c (measured with the benchmarks).
		tr := &http.Transport{
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		}
		if store != nil {
			tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				return store.DialPeer(ctx, network, addr, []string{"http/1.1"})
			}
		}
		hc = &http.Client{Transport: tr}
	}
	var opts []connect.ClientOption
	if peerToken != "" {
		opts = append(opts, connect.WithInterceptors(bearer("Bearer "+peerToken)))
	}
	return &forwarder{
		hc:      hc,
		opts:    opts,
		lock:    map[string]lockdv1connect.LockServiceClient{},
		cluster: map[string]lockdv1connect.ClusterServiceClient{},
		moved:   make(chan struct{}),
	}
}

func (f *forwarder) lockClient(url string) lockdv1connect.LockServiceClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.lock[url]
	if c == nil {
		c = lockdv1connect.NewLockServiceClient(f.hc, url, f.opts...)
		f.lock[url] = c
	}
	return c
}

func (f *forwarder) clusterClient(url string) lockdv1connect.ClusterServiceClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cluster[url]
	if c == nil {
		c = lockdv1connect.NewClusterServiceClient(f.hc, url, f.opts...)
		f.cluster[url] = c
	}
	return c
}

func (f *forwarder) close() { f.hc.CloseIdleConnections() }

// heardLeader returns the leader's id as this node knows it, or "" when
// it knows none, or when it is a follower that has not heard from its
// leader for a heartbeat timeout: a frozen leader keeps its place in a
// follower's view until the follower's own timeout (randomized between
// one and two heartbeat timeouts) starts an election, and naming it (a
// hint) or forwarding to it would send callers to a node that does not
// answer. They get "no leader" and retry a moment later instead. Not
// less than a heartbeat timeout: hashicorp/raft sends the next heartbeat
// a random tenth to fifth of it after the last reply, so a round trip, a
// lost packet or a busy leader could otherwise make a healthy follower
// answer "no leader".
func (s *Server) heardLeader() raft.ServerID {
	_, id := s.raft.LeaderWithID()
	if id == "" || string(id) == s.nodeID || s.raft.State() == raft.Leader {
		return id
	}
	ht := s.cfg.HeartbeatTimeout
	if ht <= 0 {
		ht = DefaultConfig().HeartbeatTimeout
	}
	if time.Since(s.raft.LastContact()) > ht {
		return ""
	}
	return id
}

// leaderURL decides where a request that needs the leader is served: ""
// means here (this node is the leader), else the leader's API URL. A node
// that is not the leader and cannot forward answers an unavailable error
// the client retries.
func (s *Server) leaderURL(h http.Header) (string, error) {
	if s.raft.State() == raft.Leader {
		return "", nil
	}
	if h.Get(ForwardedHeader) != "" {
		return "", s.raftError(raft.ErrNotLeader)
	}
	id := s.heardLeader()
	if id == "" {
		return "", s.raftError(raft.ErrNotLeader)
	}
	m, ok := s.fsm.Member(string(id))
	if !ok || m.API == "" || m.ID == s.nodeID {
		return "", s.apiError(connect.CodeUnavailable, lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, "leader "+string(id)+" has no known API address yet; retry")
	}
	return m.API, nil
}

// forward sends a request to the leader's API with the caller's context
// (deadline and cancellation) and returns the leader's answer or error as
// is, error details included.
func forward[Req, Res any, C any](ctx context.Context, s *Server, url string, client C, req *connect.Request[Req],
	call func(C, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	out := connect.NewRequest(req.Msg)
	out.Header().Set(ForwardedHeader, s.nodeID)
	s.guard.PeerHeaders(ctx, out.Header())
	s.metrics.forwarded.Inc()
	// A leader that stops answering (frozen, cut off) keeps the
	// connection open: the forward would wait on it for the caller's
	// whole deadline, a long poll's included, while the cluster elects
	// another. It ends when this node sees the leader change — except a
	// leadership transfer's, which changes the leader itself and is
	// answered by the old leader right after.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var moved atomic.Bool
	if req.Spec().Procedure != lockdv1connect.ClusterServiceTransferLeadershipProcedure {
		stop := afterClose(s.fwd.leaderMoved(), func() { moved.Store(true); cancel() })
		defer stop()
	}
	resp, err := call(client, fctx, out)
	if err != nil {
		if ctx.Err() == nil && !answeredByServer(err) {
			// The leader never answered (transport error): a write's outcome
			// is unknown; the client retries with the same request id.
			hint, msg := url, "forward to leader "+url+": "+err.Error()
			if moved.Load() {
				hint, _ = s.leaderURL(nil) // the new one, if known
				if hint == "" && s.raft.State() == raft.Leader {
					hint = s.apiURL
				}
				msg = "forward to leader " + url + " ended: the leader changed; retry"
			}
			return nil, s.detailError(connect.CodeUnavailable, msg,
				&lockdv1.ErrorDetail{Reason: lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN, LeaderApi: hint})
		}
		return nil, err // the leader's own answer, details included
	}
	return connect.NewResponse(resp.Msg), nil
}

// afterClose runs f once ch is closed, unless stop is called first.
func afterClose(ch <-chan struct{}, f func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			f()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// answeredByServer reports whether err is an error a lockd node returned:
// those always carry an ErrorDetail.
func answeredByServer(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if _, ok := v.(*lockdv1.ErrorDetail); ok {
				return true
			}
		}
	}
	return false
}

// viaLeader serves a LockService request here when this node is the leader,
// or forwards it.
func viaLeader[Req, Res any](ctx context.Context, a *api, req *connect.Request[Req],
	call func(lockdv1connect.LockServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
	local func() (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	url, err := a.s.leaderURL(req.Header())
	if err != nil {
		return nil, err
	}
	if url == "" {
		return local()
	}
	return forward(ctx, a.s, url, a.s.fwd.lockClient(url), req, call)
}

// bearer sets the Authorization header of a node's unary calls to others.
func bearer(header string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", header)
			return next(ctx, req)
		}
	}
}
