package lockd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	lockdv1connect "github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"

	"github.com/lockd-dev/lockd/internal/wire"
)

// Client is a connection to a lockd cluster through one or more endpoints.
// It is safe for concurrent use. Locks are taken through a Session, which
// owns the lease they live and die with; a Client may hold many sessions.
type Client struct {
	cfg        config
	ownsHTTP   bool
	h1         *http.Client      // unary calls while an endpoint has no stream
	conns      *wire.ConnTracker // the own transports' connections; nil with WithHTTPClient
	ka         *wire.KAScheduler
	logger     *slog.Logger
	rawClient  lockdv1connect.LockServiceClient
	rawCluster lockdv1connect.ClusterServiceClient

	eps      *wire.Endpoints
	call     *wire.Caller
	mu       sync.Mutex
	sessions map[*Session]struct{}
	closing  bool // no new sessions
	closed   bool // no calls at all

	notices noticeHub // release-request notices (notices.go)
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
	if cfg.dial != nil && cfg.httpClient != nil {
		return nil, fmt.Errorf("%w: WithDialer and WithHTTPClient together: dial in the HTTP client's transport", ErrInvalidArgument)
	}
	if len(cfg.endpoints) == 0 {
		cfg.endpoints = []string{DefaultEndpoint}
	}
	c := &Client{cfg: cfg, sessions: map[*Session]struct{}{}}
	c.notices.init(c)
	c.h1 = cfg.httpClient
	if cfg.httpClient == nil {
		h2, h1 := wire.NewTransports()
		if cfg.dial != nil {
			h1.DialContext, h2.DialContext = cfg.dial, cfg.dial
		}
		if cfg.tlsOn() {
			// HTTP/1.1 stays HTTP/1.1 over TLS (wire.NewTransports):
			// the stream's transport is the one that speaks HTTP/2.
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
	c.eps = wire.NewEndpoints(c.cfg.endpoints, c.newEndpoint, c.logger)
	c.call = &wire.Caller{Eps: c.eps, Conns: c.conns, H1: c.h1, Logger: c.logger,
		RequestTimeout: c.cfg.requestTimeout, RetryTimeout: c.cfg.retryTimeout, ConnectTimeout: c.cfg.connectTimeout,
		MapError: mapError, Closed: c.isClosed, Stream: c.cfg.stream, OnNotice: c.notices.deliver}
	c.ka = wire.NewKAScheduler(c.call)
	c.rawClient = wire.NewService(c.call)
	c.rawCluster = wire.NewClusterService(c.call)
	return c, nil
}

func (c *Client) newEndpoint(url string) *wire.Node {
	ep := &wire.Node{
		URL:     url,
		Svc:     lockdv1connect.NewLockServiceClient(c.h1, url, c.clientOptions()...),
		Cluster: lockdv1connect.NewClusterServiceClient(c.h1, url, c.clientOptions()...),
	}
	if c.cfg.stream {
		ep.Svc2 = lockdv1connect.NewLockServiceClient(c.cfg.httpClient, url, c.clientOptions()...)
		sessions := wire.StreamHTTPClient(c.cfg.httpClient)
		if c.ownsHTTP {
			// The stream on an upgraded HTTP/1.1 connection of its own,
			// HTTP/2 where the server does not upgrade (wire/upgrade.go).
			// A caller's own HTTP client may speak only HTTP/2, which
			// cannot upgrade: its stream is an HTTP/2 stream.
			sessions = wire.UpgradeHTTPClient(c.h1, sessions)
		}
		ep.Sessions = lockdv1connect.NewSessionServiceClient(sessions, url, c.clientOptions()...)
	}
	return ep
}

// ClusterID returns the id of the cluster the client talks to, or "" before
// the first answer that carried one.
func (c *Client) ClusterID() string { return c.eps.ClusterID() }

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
	c.ka.Close()
	c.notices.close() // waits for its goroutines
	c.call.CloseStreams()
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
