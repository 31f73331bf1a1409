package server

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	lockdapi "github.com/lockd-dev/lockd/internal/api"
)

// This file serves the API (internal/api) over HTTP on the node's
// listener, and re-exports what the API defines that users of this
// package name.

// ForwardedHeader marks a call a follower forwarded to the leader; see
// api.ForwardedHeader.
const ForwardedHeader = lockdapi.ForwardedHeader

// ForwardedIdentityHeader carries the forwarding follower's view of the
// caller; see api.ForwardedIdentityHeader.
const ForwardedIdentityHeader = lockdapi.ForwardedIdentityHeader

// ClusterIDHeader is set on every API response to the cluster's id.
const ClusterIDHeader = lockdapi.ClusterIDHeader

// TLSIdentity is who a verified client certificate names; see
// api.TLSIdentity.
type TLSIdentity = lockdapi.TLSIdentity

// TLSIdentity returns the identity named by the client certificate of a
// connection; see api.Server.TLSIdentity.
func (s *Server) TLSIdentity(cs *tls.ConnectionState) (TLSIdentity, bool) {
	return s.api.TLSIdentity(cs)
}

// Handler returns the HTTP handler of the node (api.Server.Handler).
func (s *Server) Handler(g prometheus.Gatherer) http.Handler { return s.api.Handler(g) }

// serveHTTP serves the API on the listener until Close.
func (s *Server) serveHTTP(g prometheus.Gatherer) {
	s.httpSrv = &http.Server{
		Handler:           s.Handler(g),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second, // request bodies are small
		// A queued Acquire blocks up to MaxPollTimeout after its proposal.
		WriteTimeout: s.cfg.MaxPollTimeout + s.cfg.ApplyTimeout + 10*time.Second,
		IdleTimeout:  2 * time.Minute,
		// TLS handshake errors (scanners, clients without a certificate)
		// and the like, into the node's log.
		ErrorLog: slog.NewLogLogger(s.log.With("component", "http").Handler(), slog.LevelInfo),
	}
	s.httpSrv.Protocols = new(http.Protocols)
	s.httpSrv.Protocols.SetHTTP1(true)
	s.httpSrv.Protocols.SetUnencryptedHTTP2(true)
	s.httpSrv.Protocols.SetHTTP2(true)
	ln := s.api.Listener(s.capConns(s.lis)) // capped before TLS: a refused connection costs no handshake
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("api server stopped", "err", err)
		}
	}()
}
