package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/loadgen"
)

// benchDriver runs loadgen workloads on lockd through the public client
// API only, as an application would.
//
// Connections are counted by the dialer of each client (lockd.WithDialer
// beneath the client's own transports, so the count is what a default
// client opens). The server exports no connection counter, and sampling
// /proc/net/tcp would miss connections opened and closed between two
// samples, which is the churn worth seeing.
type benchDriver struct {
	endpoints []string
	tls       *tls.Config // nil: plaintext
	stream    bool        // the session stream ($LOCKD_STREAM)
	dials     atomic.Int64
}

func newBenchDriver(endpoints []string, stream bool) *benchDriver {
	return &benchDriver{endpoints: endpoints, stream: stream}
}

// System names lockd in the report.
func (d *benchDriver) System() string { return "lockd" }

// ConnsOpened returns the connections dialled by every client so far.
func (d *benchDriver) ConnsOpened() int64 { return d.dials.Load() }

func (d *benchDriver) newLockdClient() (*benchClient, error) {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	opts := []lockd.Option{lockd.WithEndpoints(d.endpoints...), lockd.WithStream(d.stream),
		lockd.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			d.dials.Add(1)
			return dialer.DialContext(ctx, network, addr)
		})}
	if d.tls != nil {
		opts = append(opts, lockd.WithTLSConfig(d.tls))
	}
	c, err := lockd.New(opts...)
	if err != nil {
		return nil, usageError{fmt.Errorf("--endpoints: %w", err)}
	}
	return &benchClient{c: c}, nil
}

// NewClient opens a client with its own transport and connections.
func (d *benchDriver) NewClient(ctx context.Context) (loadgen.Client, error) {
	return d.newLockdClient()
}

// ErrorKind names lockd's sentinel errors for the report.
func (d *benchDriver) ErrorKind(err error) string {
	kinds := []struct {
		err  error
		kind string
	}{
		{context.DeadlineExceeded, "timeout"},
		{lockd.ErrNoLeader, "no-leader"},
		{lockd.ErrUnavailable, "unavailable"},
		{lockd.ErrLeaseLost, "lease-lost"},
		{lockd.ErrSessionClosed, "session-closed"},
		{lockd.ErrWaitDropped, "wait-dropped"},
		{lockd.ErrTooMany, "server-limit"},
		{lockd.ErrNotHeld, "not-held"},
		{lockd.ErrBusy, "busy"},
		{lockd.ErrClusterMismatch, "cluster-mismatch"},
		{lockd.ErrInvalidArgument, "invalid-argument"},
		{lockd.ErrClosed, "client-closed"},
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return "other"
}

// benchClient is one worker's lockd.Client.
type benchClient struct {
	c *lockd.Client
}

// NewSession opens a session with the given TTL.
func (b *benchClient) NewSession(ctx context.Context, ttl time.Duration) (loadgen.Session, error) {
	s, err := b.c.NewSession(ctx, lockd.WithTTL(ttl), lockd.WithOwner("lockd bench"))
	if err != nil {
		return nil, err
	}
	return benchSession{s}, nil
}

// Close closes the client, its sessions and its connections.
func (b *benchClient) Close(ctx context.Context) error {
	return closeLockdClient(ctx, b.c)
}

// closeLockdClient is the one call of lockd.Client.Close, whose signature
// may gain a context.
func closeLockdClient(ctx context.Context, c *lockd.Client) error { return c.Close(ctx) }

// benchSession adapts *lockd.Session to loadgen.Session.
type benchSession struct{ s *lockd.Session }

// NewMutex returns the session's mutex on name.
func (s benchSession) NewMutex(name string) loadgen.Mutex { return s.s.NewMutex(name) }

// Done is closed when the session's lease is lost.
func (s benchSession) Done() <-chan struct{} { return s.s.Done() }

// Close closes the session on the server.
func (s benchSession) Close(ctx context.Context) error { return s.s.Close(ctx) }

// splitEndpoints splits a comma-separated --endpoints value.
func splitEndpoints(s string) []string {
	var eps []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return eps
}
