package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/loadgen"
)

// benchDriver runs loadgen workloads on lockd through the public client
// API only, as an application would.
//
// Connections are counted by the dialer of each client's HTTP transport,
// passed in with lockd.WithHTTPClient: the transport is built the way
// lockd.New builds its default one (see benchTransport), so the count is
// what a default client would open. The server exports no connection
// counter, and sampling /proc/net/tcp would miss connections opened and
// closed between two samples, which is the churn worth seeing.
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

// benchTransport is a copy of the transport lockd.New makes when it is not
// given an HTTP client (stream.go, newTransports: with the session stream,
// the h2c one that carries the stream and the unary calls beside it; with
// LOCKD_STREAM=off (WithStream(false)), the HTTP/1.1 one with 256 idle connections per host,
// as every queued Lock holds one), with a dialer that counts. Keep them in
// step, or the counts describe another client than the one users run.
func (d *benchDriver) benchTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	if d.stream {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP2(true)
		tr.Protocols.SetUnencryptedHTTP2(true)
		tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 3 * time.Second}
	} else if d.tls != nil {
		// lockd.New's HTTP/1.1 transport stays HTTP/1.1 over TLS.
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP1(true)
	}
	if d.tls != nil {
		tr.TLSClientConfig = d.tls.Clone()
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.dials.Add(1)
		return dialer.DialContext(ctx, network, addr)
	}
	return tr
}

func (d *benchDriver) newLockdClient() (*benchClient, error) {
	hc := &http.Client{Transport: d.benchTransport()}
	c, err := lockd.New(lockd.WithEndpoints(d.endpoints...), lockd.WithHTTPClient(hc), lockd.WithStream(d.stream))
	if err != nil {
		return nil, usageError{fmt.Errorf("--endpoints: %w", err)}
	}
	return &benchClient{c: c, hc: hc}, nil
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

// benchClient is one worker's lockd.Client and its HTTP client.
type benchClient struct {
	c  *lockd.Client
	hc *http.Client
}

// NewSession opens a session with the given TTL.
func (b *benchClient) NewSession(ctx context.Context, ttl time.Duration) (loadgen.Session, error) {
	s, err := b.c.NewSession(ctx, lockd.WithTTL(ttl), lockd.WithOwner("lockd bench"))
	if err != nil {
		return nil, err
	}
	return benchSession{s}, nil
}

// Close closes the client and its sessions, then its idle connections,
// which lockd.Client leaves to the owner of an HTTP client it was given.
func (b *benchClient) Close(ctx context.Context) error {
	err := closeLockdClient(ctx, b.c)
	b.hc.CloseIdleConnections()
	return err
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
