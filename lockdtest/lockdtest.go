// Package lockdtest runs a real single-node lockd server in-process for
// tests, the way miniredis does for Redis users: a temporary data dir, free
// 127.0.0.1 ports, short Raft timeouts, stopped by t.Cleanup.
//
//	srv := lockdtest.New(t)
//	c, err := lockd.New(lockd.WithEndpoints(srv.URL()))
package lockdtest

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/server"
)

// Option adjusts the test server.
type Option func(*settings)

type settings struct {
	cfg    server.Config
	logger *slog.Logger
}

// WithGrace sets the lease grace added on the leader (default 100ms).
func WithGrace(d time.Duration) Option { return func(s *settings) { s.cfg.Grace = d } }

// WithMinTTL sets the smallest session TTL accepted (default 100ms, so tests
// can use short leases).
func WithMinTTL(d time.Duration) Option { return func(s *settings) { s.cfg.MinTTL = d } }

// WithDataDir uses dir instead of a fresh temporary directory.
func WithDataDir(dir string) Option { return func(s *settings) { s.cfg.DataDir = dir } }

// WithAuthFile turns authentication on with the auth file at path (see
// docs/security.md); clients then need lockd.WithToken.
func WithAuthFile(path string) Option { return func(s *settings) { s.cfg.AuthFile = path } }

// WithAuditLog appends the server's audit log to the file at path.
func WithAuditLog(path string) Option { return func(s *settings) { s.cfg.AuditLog = path } }

// WithExactSessionCaps makes Apply enforce per-identity session caps
// exactly (lockd serve --exact-session-caps).
func WithExactSessionCaps() Option { return func(s *settings) { s.cfg.ExactSessionCaps = true } }

// WithLogger sends the server's logs to l (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(s *settings) { s.logger = l } }

// Server is a running in-process lockd node.
type Server struct {
	t      testing.TB
	cfg    server.Config
	logger *slog.Logger
	srv    *server.Server
}

// New starts a server and waits until it is the established leader. It is
// stopped by t.Cleanup.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	st := settings{cfg: server.DefaultConfig()}
	st.cfg.DataDir = t.TempDir()
	st.cfg.Listen = "127.0.0.1:0"
	st.cfg.RaftListen = "127.0.0.1:0"
	st.cfg.HeartbeatTimeout = 50 * time.Millisecond
	st.cfg.ElectionTimeout = 50 * time.Millisecond
	st.cfg.Grace = 100 * time.Millisecond
	st.cfg.MinTTL = 100 * time.Millisecond
	st.cfg.SnapshotInterval = time.Second
	for _, o := range opts {
		o(&st)
	}
	if st.logger == nil {
		st.logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{t: t, cfg: st.cfg, logger: st.logger}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	srv, err := server.New(s.cfg, server.WithLogger(s.logger))
	if err != nil {
		s.t.Fatalf("lockdtest: start server: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitLeader(ctx); err != nil {
		srv.Close()
		s.t.Fatalf("lockdtest: server did not become leader: %v", err)
	}
	s.srv = srv
	// Restart on the same ports.
	s.cfg.Listen = srv.Addr().String()
	s.cfg.RaftListen = srv.RaftAddr()
}

// URL is the server's API URL (http://127.0.0.1:PORT).
func (s *Server) URL() string { return s.srv.URL() }

// DataDir is the server's data directory.
func (s *Server) DataDir() string { return s.cfg.DataDir }

// Stop shuts the server down; it is safe to call more than once.
func (s *Server) Stop() {
	if s.srv != nil {
		if err := s.srv.Close(); err != nil {
			s.t.Errorf("lockdtest: stop server: %v", err)
		}
		s.srv = nil
	}
}

// Restart stops the server and starts it again on the same data dir and
// ports, like a process restart after a crash or upgrade.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Addr is the API listener's address.
func (s *Server) Addr() net.Addr { return s.srv.Addr() }
