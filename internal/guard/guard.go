// Package guard is a lockd node's access control, in front of its API:
// who the caller is (bearer token or client certificate), whether it may
// make a call (grants of the auth file, reloaded without a restart), the
// caller's limits (request rate, sessions, queued Acquires, streams), the
// audit log, the Host/Origin check (DNS rebinding) and the per-source cap
// of API connections. It is one HTTP middleware (Handler), one Connect
// interceptor (Interceptor), a listener wrapper (Listener) and the few
// checks the handlers make themselves (CheckSessions, StartWait, a
// stream's OpenStream and AuthWatch).
//
// The guard knows nothing of the node that uses it: what it needs of the
// node (the cluster id, an identity's live sessions, the error the API
// answers with, a TLS client's identity) is injected in Deps.
package guard

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/auth"
	"github.com/lockd-dev/lockd/internal/certs"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// State is what the guard reads of the node's replicated state.
type State interface {
	// ClusterID is the cluster's id ("" before the first leader), carried
	// in every error the guard makes.
	ClusterID() string
	// SessionsOf counts the live sessions of an identity (the session
	// cap).
	SessionsOf(identity string) int
}

// Deps is what the guard needs of the node that uses it.
type Deps struct {
	// NodeID names the node in audit lines.
	NodeID string
	// Log is the node's logger.
	Log *slog.Logger
	// State is the node's replicated state.
	State State
	// APIError makes the error the API answers with (its ErrorDetail).
	APIError func(code connect.Code, reason lockdv1.ErrorReason, msg string) *connect.Error
	// StreamError turns an API error into a session-stream frame's error.
	StreamError func(error) *lockdv1.StreamError
	// TLS is the node's certificate store (nil: plaintext): its names are
	// the node's own in the Host check, and with it a node forwards its
	// callers' identities over mutual TLS.
	TLS *certs.Store
	// TLSIdentity names a TLS client by its verified certificate (ok
	// false: none, or not verified); peer reports a cluster member's.
	TLSIdentity func(*tls.ConnectionState) (name string, peer, ok bool)
	// LimitHits counts refusals by a limit, by reason (rate, sessions,
	// waits, streams, conns); AuthReloads the auth file's reloads by
	// outcome (ok, error).
	LimitHits, AuthReloads *prometheus.CounterVec
	// Registerer takes the guard's own metrics (the Host check's).
	Registerer prometheus.Registerer
}

// Config is the guard's part of the node's configuration.
type Config struct {
	Security
	// AllowedHosts are the names the node answers beside its own
	// (--allowed-hosts; "*": no Host check).
	AllowedHosts []string
	// OwnHosts are the node's own host[:port]s: --listen, --advertise,
	// --raft-advertise.
	OwnHosts []string
}

// Guard is one node's access control. Its methods are safe for
// concurrent use.
type Guard struct {
	d         Deps
	auth      *authReloader // nil: authentication off
	peerToken string        // presented when forwarding and joining
	audit     *auditLog     // nil: no audit log
	auditFile io.Closer
	limits    *limiter
	hosts     *hostPolicy
	conns     *connCap // nil: no per-source connection cap
}

// New opens the guard: reads the auth file and the peer token, opens the
// audit log. Close closes the audit log. Every field of d but NodeID, TLS
// and TLSIdentity is required: a missing one is an error here rather
// than a panic at the guard's first refusal.
func New(c Config, d Deps) (*Guard, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	g := &Guard{d: d}
	g.openHostPolicy(c)
	if err := g.openSecurity(c.Security); err != nil {
		return nil, err
	}
	return g, nil
}

// check reports the first required field of d that is missing.
func (d *Deps) check() error {
	for _, f := range []struct {
		name    string
		missing bool
	}{
		{"Log", d.Log == nil},
		{"State", d.State == nil},
		{"APIError", d.APIError == nil},
		{"StreamError", d.StreamError == nil},
		{"LimitHits", d.LimitHits == nil},
		{"AuthReloads", d.AuthReloads == nil},
		{"Registerer", d.Registerer == nil},
	} {
		if f.missing {
			return fmt.Errorf("guard: Deps.%s is required", f.name)
		}
	}
	return nil
}

// Close writes the audit lines still counted and closes the audit log.
func (g *Guard) Close() error {
	g.audit.flush()
	if g.auditFile != nil {
		return g.auditFile.Close()
	}
	return nil
}

// PeerToken is this node's own token (--peer-token-file), "" without one.
func (g *Guard) PeerToken() string { return g.peerToken }

// Handler is the guard's HTTP middleware: the Host/Origin check, then
// each request's caller put in its context (IdentityOf).
func (g *Guard) Handler(next http.Handler) http.Handler {
	return g.hosts.handler(g.authenticate(next))
}

// HostCheck wraps h (the pprof listener's handler, say) in the node's
// Host/Origin check: the same rule as the API's.
func (g *Guard) HostCheck(h http.Handler) http.Handler { return g.hosts.handler(h) }

// Denied is the answer to a call the caller may not make.
func (g *Guard) Denied(msg string) *connect.Error {
	return g.d.APIError(connect.CodePermissionDenied, lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, msg)
}

// Listener wraps the API listener l in the per-source cap of max open
// connections (0: the default, -1: none); exempt spares the other
// members' addresses.
func (g *Guard) Listener(l net.Listener, max int, exempt func(netip.Addr) bool) net.Listener {
	if max < 0 {
		return l
	}
	if max == 0 {
		max = DefaultMaxConnsPerSource
	}
	hits := g.d.LimitHits.WithLabelValues("conns")
	logs := &sparseLog{log: g.d.Log.With("component", "http")}
	g.conns = newConnCap(l, max, exempt, func(c net.Conn, open int) {
		hits.Inc()
		msg := fmt.Sprintf("connection from %s closed: its address has %d connections open, its cap (--max-conns-per-source)", c.RemoteAddr(), open)
		g.audit.netRefused(c.RemoteAddr().String(), "Connection", "resource_exhausted", msg)
		logs.warn("connection refused: its source address is at its cap (--max-conns-per-source)", "peer", c.RemoteAddr().String(), "open", open)
	})
	return g.conns
}

// OpenConns returns the API connections counted for ip (0 without a cap):
// for tests.
func (g *Guard) OpenConns(ip netip.Addr) int {
	if g.conns == nil {
		return 0
	}
	return g.conns.open(ip)
}

// StreamsOpen returns the streams counted per identity or address: for
// tests.
func (g *Guard) StreamsOpen() map[string]int {
	g.limits.mu.Lock()
	defer g.limits.mu.Unlock()
	m := make(map[string]int, len(g.limits.streams))
	for k, v := range g.limits.streams {
		m[k] = v
	}
	return m
}

// HostRefusals returns the requests the Host check refused so far: for
// tests.
func (g *Guard) HostRefusals() *prometheus.CounterVec { return g.hosts.refused }

// OpenStream admits a session stream for the caller in ctx: access as
// for CreateSession and one of its stream slots. The returned AuthWatch
// judges the caller again when the auth rules change (Recheck); release
// frees the slot.
func (g *Guard) OpenStream(ctx context.Context) (aw AuthWatch, release func(), err error) {
	aw = g.watchAuth(streamAccess)
	if err := g.allowed(ctx, streamAccess); err != nil {
		g.audit.record(ctx, streamAccess, err)
		return aw, nil, err
	}
	release, err = g.limits.startStream(ctx)
	if err != nil {
		g.audit.limitRefused(ctx, streamAccess, err)
		return aw, nil, err
	}
	return aw, release, nil
}

// Recheck judges an open session stream's caller again after the rules
// changed (aw.Changed), auditing a refusal.
func (g *Guard) Recheck(ctx context.Context, aw *AuthWatch) error {
	err := aw.Check(ctx)
	if err != nil {
		g.audit.record(ctx, streamAccess, err)
	}
	return err
}

// streamAccess is what opening a session stream needs: what CreateSession
// needs.
var streamAccess = &access{op: "Stream", perm: auth.Lock, any: true}
