package lockd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/internal/endpoint"
	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"

	"github.com/lockd-dev/lockd/internal/wire"
)

// maxEndpoints bounds the endpoint list, which grows when a server names a
// leader the client was not told about.
const maxEndpoints = 32

// Client is a connection to a lockd cluster through one or more endpoints.
// It is safe for concurrent use. Locks are taken through a Session, which
// owns the lease they live and die with; a Client may hold many sessions.
type Client struct {
	cfg        config
	ownsHTTP   bool
	h1         *http.Client      // unary calls while an endpoint has no stream
	conns      *wire.ConnTracker // the own transports' connections; nil with WithHTTPClient
	ka         *kaScheduler
	logger     *slog.Logger
	rawClient  lockdv1connect.LockServiceClient
	rawCluster lockdv1connect.ClusterServiceClient

	mu        sync.Mutex
	eps       []*node
	cur       int
	clusterID string
	spoke     bool // some endpoint answered a call once
	sessions  map[*Session]struct{}
	closing   bool // no new sessions
	closed    bool // no calls at all
}

// silentFor is how long an endpoint that did not answer (refused, broke
// or timed out) is passed over while another may be tried: a frozen node
// must not cost every call an attempt timeout.
const silentFor = 10 * time.Second

// node is one server (endpoint) the client may call. Its mutable fields are
// guarded by Client.mu.
type node struct {
	url      string
	svc      lockdv1connect.LockServiceClient // HTTP/1.1 (or WithHTTPClient's)
	svc2     lockdv1connect.LockServiceClient // h2c, once a stream is open; nil without streams
	sessions lockdv1connect.SessionServiceClient
	cluster  lockdv1connect.ClusterServiceClient
	stream   wire.StreamSlot
	refused  bool      // answered another cluster's id
	silent   time.Time // did not answer; passed over until then
	spoke    bool      // answered a call (over HTTP) at least once
	probed   time.Time // last probed for HTTP (dial.go)
	notAPI   error     // does not speak the API (dial.go); passed over until notUntil
	notUntil time.Time
	abandon  bool      // abandoned (abandon.go) and has not answered since
	leftAt   time.Time // when it was last abandoned
}

// New returns a Client for the given options. It does not contact the
// servers; the first call does. It returns an error that matches
// ErrInvalidArgument when an option has a bad value.
func New(opts ...Option) (*Client, error) {
	cfg := config{
		requestTimeout: DefaultRequestTimeout,
		retryTimeout:   DefaultRetryTimeout,
		stream:         true,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.checkTLS(); err != nil {
		return nil, err
	}
	if len(cfg.endpoints) == 0 {
		cfg.endpoints = []string{DefaultEndpoint}
	}
	c := &Client{cfg: cfg, sessions: map[*Session]struct{}{}}
	c.ka = newKAScheduler(c)
	c.h1 = cfg.httpClient
	if cfg.httpClient == nil {
		h2, h1 := wire.NewTransports()
		if cfg.tlsOn() {
			// HTTP/1.1 stays HTTP/1.1 over TLS: the stream's transport
			// is the one that speaks HTTP/2.
			h1.Protocols = new(http.Protocols)
			h1.Protocols.SetHTTP1(true)
			cfg.setTLS(h1, []string{"http/1.1"})
			cfg.setTLS(h2, []string{"h2"})
		}
		c.conns = wire.NewConnTracker()
		c.conns.Track(h1)
		c.conns.Track(h2)
		c.h1 = &http.Client{Transport: h1}
		c.cfg.httpClient = &http.Client{Transport: h2}
		if !cfg.stream {
			c.cfg.httpClient = c.h1
		}
		c.ownsHTTP = true
	}
	c.logger = cfg.logger
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	for _, u := range c.cfg.endpoints {
		c.eps = append(c.eps, c.newEndpoint(u))
	}
	// Start at a random endpoint, so that many clients given the same list
	// do not all wait on its first node when that one hangs.
	c.cur = rand.IntN(len(c.eps))
	c.rawClient = &service{c: c}
	c.rawCluster = &clusterService{c: c}
	return c, nil
}

func (c *Client) newEndpoint(url string) *node {
	ep := &node{
		url:     url,
		svc:     lockdv1connect.NewLockServiceClient(c.h1, url, c.clientOptions()...),
		cluster: lockdv1connect.NewClusterServiceClient(c.h1, url, c.clientOptions()...),
	}
	if c.cfg.stream {
		ep.svc2 = lockdv1connect.NewLockServiceClient(c.cfg.httpClient, url, c.clientOptions()...)
		ep.sessions = lockdv1connect.NewSessionServiceClient(c.cfg.httpClient, url, c.clientOptions()...)
	}
	return ep
}

// unary returns the client for ep's unary calls: over the stream's
// connection once a stream is open there (HTTP/2 passes), else HTTP/1.1.
func (ep *node) unary() lockdv1connect.LockServiceClient {
	if ep.svc2 != nil && ep.stream.IsOpen() {
		return ep.svc2
	}
	return ep.svc
}

// Close closes every session of the client (releasing their locks, best
// effort, each bounded by ctx and the request timeout) and the client's idle
// connections. Calls made after Close fail with ErrClosed. A second Close
// returns nil at once.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	sessions := make([]*Session, 0, len(c.sessions))
	for s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.mu.Unlock()

	var wg sync.WaitGroup
	errs := make([]error, len(sessions))
	for i, s := range sessions {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
			defer cancel()
			errs[i] = s.Close(ctx)
		})
	}
	wg.Wait()
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.ka.close()
	c.closeStreams()
	if c.ownsHTTP {
		c.cfg.httpClient.CloseIdleConnections()
		c.h1.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// Service returns the raw API for calls the package does not wrap (status,
// describe, list, force-release). Every call goes through the same failover
// and retry logic as the rest of the client: it moves between endpoints,
// follows leader hints, checks the cluster id and maps errors to the
// package's sentinels (the *connect.Error stays reachable with errors.As).
// Calls are retried only when that is safe: reads always, mutations when
// they carry a request id or sequence number, ForceRelease only when the
// server did not take it. A queued Acquire's long poll is capped at 25 s.
func (c *Client) Service() lockdv1connect.LockServiceClient { return c.rawClient }

// ClusterService returns the raw membership API (remove a member, transfer
// leadership, join), through the same failover, retry, leader following,
// cluster-id check and error mapping as Service. RemoveMember and Join are
// resent after an unknown outcome (they are idempotent); TransferLeadership
// is not, as a second one would move leadership again.
func (c *Client) ClusterService() lockdv1connect.ClusterServiceClient { return c.rawCluster }

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// pick returns the endpoint to try next, and whether another usable one
// exists. It passes over endpoints of another cluster or that do not speak
// the API (their error when no other is left), and endpoints that
// did not answer lately unless every usable one is such (then the one
// silent longest goes first).
func (c *Client) pick() (*node, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var best *node
	var notAPI error
	bestAt, usable := 0, 0
	for i := range c.eps {
		at := (c.cur + i) % len(c.eps)
		ep := c.eps[at]
		foreign := ep.notAPI != nil && now.Before(ep.notUntil)
		if foreign && notAPI == nil {
			notAPI = ep.notAPI
		}
		if ep.refused || foreign {
			continue
		}
		usable++
		better := best == nil ||
			best.silent.After(now) && (!ep.silent.After(now) || ep.silent.Before(best.silent))
		if better {
			best, bestAt = ep, at
		}
	}
	if best == nil && notAPI != nil {
		return nil, false, notAPI
	}
	if best == nil {
		return nil, false, fmt.Errorf("%w: every endpoint answered for a cluster other than %s", ErrClusterMismatch, c.clusterID)
	}
	c.cur = bestAt
	return best, usable > 1, nil
}

// silent records that ep did not answer.
func (c *Client) silent(ep *node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ep.silent = time.Now().Add(silentFor)
}

// answered records that ep answered.
func (c *Client) answered(ep *node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ep.silent = time.Time{}
	ep.spoke, c.spoke = true, true
	ep.abandon = false
}

// rotate moves past ep after it failed, unless another call already did.
func (c *Client) rotate(ep *node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.eps[c.cur] == ep {
		c.cur = (c.cur + 1) % len(c.eps)
	}
}

// follow makes the leader named in a hint the next endpoint to try. It
// reports whether the hint named an endpoint other than from.
func (c *Client) follow(from *node, hint string) bool {
	u, err := endpoint.Normalize(hint)
	if err != nil || u == from.url {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, ep := range c.eps {
		if ep.url == u {
			if ep.refused {
				return false
			}
			c.cur = i
			if !ep.abandon || time.Since(ep.leftAt) >= staleHintFor {
				ep.silent = time.Time{} // a server just saw it lead
			}
			return true
		}
	}
	if len(c.eps) >= maxEndpoints {
		return false
	}
	c.eps = append(c.eps, c.newEndpoint(u))
	c.cur = len(c.eps) - 1
	c.logger.Info("leader endpoint added", "endpoint", u)
	return true
}

// checkCluster records the first cluster id seen and refuses an endpoint
// that answers with another one.
func (c *Client) checkCluster(ep *node, id string) error {
	if id == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.clusterID == "" {
		c.clusterID = id
		return nil
	}
	if c.clusterID == id {
		return nil
	}
	if !ep.refused {
		ep.refused = true
		c.logger.Warn("endpoint refused", "endpoint", ep.url, "cluster", id, "want_cluster", c.clusterID)
	}
	return fmt.Errorf("%w: %s answered for cluster %s, not %s", ErrClusterMismatch, ep.url, id, c.clusterID)
}

// ClusterID returns the id of the cluster the client talks to, or "" before
// the first answer that carried one.
func (c *Client) ClusterID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clusterID
}

func (c *Client) addSession(s *Session) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return ErrClosed
	}
	c.sessions[s] = struct{}{}
	return nil
}

func (c *Client) removeSession(s *Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sessions, s)
}
