package lockd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// maxEndpoints bounds the endpoint list, which grows when a server names a
// leader the client was not told about.
const maxEndpoints = 32

// Client is a connection to a lockd cluster through one or more endpoints.
// It is safe for concurrent use. Locks are taken through a Session, which
// owns the lease they live and die with; a Client may hold many sessions.
type Client struct {
	cfg       config
	ownsHTTP  bool
	logger    *slog.Logger
	rawClient lockdv1connect.LockServiceClient

	mu        sync.Mutex
	eps       []*endpoint
	cur       int
	clusterID string
	sessions  map[*Session]struct{}
	closing   bool // no new sessions
	closed    bool // no calls at all
}

// endpoint is one server the client may call.
type endpoint struct {
	url     string
	svc     lockdv1connect.LockServiceClient
	refused bool // answered another cluster's id; guarded by Client.mu
}

// New returns a Client for the given options. It does not contact the
// servers; the first session does. It returns an error that matches
// ErrInvalidArgument when an option has a bad value.
func New(opts ...Option) (*Client, error) {
	cfg := config{
		requestTimeout: DefaultRequestTimeout,
		retryTimeout:   DefaultRetryTimeout,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if len(cfg.endpoints) == 0 {
		cfg.endpoints = []string{DefaultEndpoint}
	}
	c := &Client{cfg: cfg, sessions: map[*Session]struct{}{}}
	if cfg.httpClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// Each queued Lock holds a connection for its long poll.
		tr.MaxIdleConnsPerHost = 256
		c.cfg.httpClient = &http.Client{Transport: tr}
		c.ownsHTTP = true
	}
	c.logger = cfg.logger
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	for _, u := range c.cfg.endpoints {
		c.eps = append(c.eps, c.newEndpoint(u))
	}
	c.rawClient = &service{c: c}
	return c, nil
}

func (c *Client) newEndpoint(url string) *endpoint {
	return &endpoint{url: url, svc: lockdv1connect.NewLockServiceClient(c.cfg.httpClient, url)}
}

// Close closes every session of the client (releasing their locks, best
// effort, bounded by the request timeout) and the client's idle
// connections. Calls made after Close fail with ErrClosed.
func (c *Client) Close() error {
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
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.requestTimeout)
			defer cancel()
			errs[i] = s.Close(ctx)
		})
	}
	wg.Wait()
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	if c.ownsHTTP {
		c.cfg.httpClient.CloseIdleConnections()
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
// server did not take it.
func (c *Client) Service() lockdv1connect.LockServiceClient { return c.rawClient }

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// pick returns the endpoint to try next.
func (c *Client) pick() (*endpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for range c.eps {
		ep := c.eps[c.cur]
		if !ep.refused {
			return ep, nil
		}
		c.cur = (c.cur + 1) % len(c.eps)
	}
	return nil, fmt.Errorf("%w: every endpoint answered for a cluster other than %s", ErrClusterMismatch, c.clusterID)
}

// rotate moves past ep after it failed, unless another call already did.
func (c *Client) rotate(ep *endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.eps[c.cur] == ep {
		c.cur = (c.cur + 1) % len(c.eps)
	}
}

// follow makes the leader named in a hint the next endpoint to try. It
// reports whether the hint named an endpoint other than from.
func (c *Client) follow(from *endpoint, hint string) bool {
	u, err := normalizeEndpoint(hint)
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
func (c *Client) checkCluster(ep *endpoint, id string) error {
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

// invoke calls method with msg through the retry loop and checks the cluster
// id of the answer. Errors are mapped for lock name (may be "").
func invoke[Req, Res any](ctx context.Context, c *Client, p policy, name string, msg *Req, hdr http.Header,
	method func(lockdv1connect.LockServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	var resp *connect.Response[Res]
	err := c.do(ctx, p, name, func(ctx context.Context, ep *endpoint) error {
		req := connect.NewRequest(msg)
		for k, v := range hdr {
			req.Header()[k] = v
		}
		r, err := method(ep.svc, ctx, req)
		if err != nil {
			if d := errorDetail(err); d != nil {
				if cerr := c.checkCluster(ep, d.GetClusterId()); cerr != nil {
					return cerr
				}
			}
			return err
		}
		if m, ok := any(r.Msg).(interface{ GetClusterId() string }); ok {
			if err := c.checkCluster(ep, m.GetClusterId()); err != nil {
				return err
			}
		}
		resp = r
		return nil
	})
	return resp, err
}
