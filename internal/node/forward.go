package node

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// Forwarder holds Connect clients to other nodes' APIs, for forwarding
// writes and linearizable reads to the leader.
type Forwarder struct {
	hc   *http.Client
	opts []connect.ClientOption // the peer token, when set

	mu      sync.Mutex
	lock    map[string]lockdv1connect.LockServiceClient
	cluster map[string]lockdv1connect.ClusterServiceClient
	moved   chan struct{} // closed and replaced when this node sees the leader change
}

// LeaderMoved returns a channel closed at the next leader change this node
// observes (a follower's view included: the leader it forwards to).
func (f *Forwarder) LeaderMoved() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.moved
}

// leaderChanged ends the forwards in flight: they went to a leader this
// node no longer follows (countLeaderChanges calls it on every Raft leader
// observation).
func (f *Forwarder) leaderChanged() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.moved)
	f.moved = make(chan struct{})
}

// newForwarder returns a Forwarder that uses hc, or its own transport
// when hc is nil: over TLS with the node's certificate when store is not
// nil, every new connection with the current files and only to a node
// whose certificate is a member's (certs.Store.DialPeer). Its every call to
// another node (a forward, a join, a catch-up poll) presents peerToken,
// when set.
func newForwarder(hc *http.Client, store *certs.Store, peerToken string) *Forwarder {
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
	return &Forwarder{
		hc:      hc,
		opts:    opts,
		lock:    map[string]lockdv1connect.LockServiceClient{},
		cluster: map[string]lockdv1connect.ClusterServiceClient{},
		moved:   make(chan struct{}),
	}
}

// LockClient returns the LockService client of the node at url.
func (f *Forwarder) LockClient(url string) lockdv1connect.LockServiceClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.lock[url]
	if c == nil {
		c = lockdv1connect.NewLockServiceClient(f.hc, url, f.opts...)
		f.lock[url] = c
	}
	return c
}

// ClusterClient returns the ClusterService client of the node at url.
func (f *Forwarder) ClusterClient(url string) lockdv1connect.ClusterServiceClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cluster[url]
	if c == nil {
		c = lockdv1connect.NewClusterServiceClient(f.hc, url, f.opts...)
		f.cluster[url] = c
	}
	return c
}

func (f *Forwarder) close() { f.hc.CloseIdleConnections() }

// HeardLeader returns the leader's id as this node knows it, or "" when
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
func (s *Node) HeardLeader() raft.ServerID {
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

// bearer sets the Authorization header of a node's unary calls to others.
func bearer(header string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", header)
			return next(ctx, req)
		}
	}
}

// HTTPClient returns the HTTP client of the calls to other members.
func (f *Forwarder) HTTPClient() *http.Client { return f.hc }
