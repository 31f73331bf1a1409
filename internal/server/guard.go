package server

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/url"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	lockdapi "github.com/lockd-dev/lockd/internal/api"
	"github.com/lockd-dev/lockd/internal/guard"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Access control lives in internal/guard; this file builds the node's
// guard from its configuration and hands it what it needs of the node.

// Security is the access-control part of Config (docs/security.md); see
// guard.Security.
type Security = guard.Security

// AuditEntry is one line of the audit log; see guard.AuditEntry.
type AuditEntry = guard.AuditEntry

// openGuard builds the node's guard once its API URL, node id, TLS store
// and metrics are known: the hosts of --listen, --advertise (or the URL
// derived from the listener) and --raft-advertise are its own names.
func (s *Server) openGuard(cfg Config, reg prometheus.Registerer) error {
	own := []string{cfg.Listen, cfg.RaftAdvertise}
	if u, err := url.Parse(s.apiURL); err == nil {
		own = append(own, u.Host)
	}
	d := guard.Deps{
		NodeID: s.nodeID,
		Log:    s.log,
		State:  s.fsm,
		APIError: func(code connect.Code, reason lockdv1.ErrorReason, msg string) *connect.Error {
			return s.api.Errors().APIError(code, reason, msg)
		},
		StreamError: lockdapi.StreamError,
		TLS:         s.tls,
		LimitHits:   s.api.LimitHits(),
		AuthReloads: s.api.AuthReloads(),
		Registerer:  reg,
	}
	if s.tls != nil {
		d.TLSIdentity = func(cs *tls.ConnectionState) (string, bool, bool) {
			id, ok := s.TLSIdentity(cs)
			return id.Name, id.Peer, ok
		}
	}
	g, err := guard.New(guard.Config{Security: cfg.Security, AllowedHosts: cfg.AllowedHosts, OwnHosts: own}, d)
	if err != nil {
		return err
	}
	s.guard = g
	return nil
}

// GuardHost wraps h (the pprof listener's handler, say) in the node's
// Host/Origin check: the same rule as the API's.
func (s *Server) GuardHost(h http.Handler) http.Handler { return s.guard.HostCheck(h) }

// ReloadAuth reads the auth file again (SIGHUP). Calls that start after it
// returns use the new rules; open streams judge their caller again at once.
// A file that does not parse is an error and the previous rules stay in
// force. Without --auth-file it does nothing.
func (s *Server) ReloadAuth() error { return s.guard.ReloadAuth() }

// capConns wraps the API listener in the guard's per-source cap, unless
// it is off, and keeps the members' names resolved for its exemption.
func (s *Server) capConns(l net.Listener) net.Listener {
	if s.cfg.MaxConnsPerSource < 0 {
		return l
	}
	s.nd.Peers().ResolvePeers()
	return s.guard.Listener(l, s.cfg.MaxConnsPerSource, s.nd.Peers().IsPeer)
}
