// Package server runs one lockd node: it assembles the Raft side
// (internal/node), the guard (internal/guard) and the API handlers, and
// serves them over HTTP. See DESIGN.md in this folder.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	lockdapi "github.com/lockd-dev/lockd/internal/api"
	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/node"
)

// Option changes how New builds a server.
type Option func(*options)

type options struct {
	logger    *slog.Logger
	registry  prometheus.Registerer
	version   string
	transport raft.Transport
	fwdClient *http.Client
	bootstrap []raft.Server
	logStore  func(raft.LogStore) raft.LogStore
	fatal     func(error)
	reportVer uint32
}

// WithLogStoreWrapper wraps the Raft log store (tests use it to make the
// disk hang).
func WithLogStoreWrapper(f func(raft.LogStore) raft.LogStore) Option {
	return func(o *options) { o.logStore = f }
}

// WithFatal sets what the node does when it must stop because it cannot
// make progress (the leader watchdog). Default: log the error and exit the
// process with status 1.
func WithFatal(f func(error)) Option { return func(o *options) { o.fatal = f } }

// WithReportedApplyVersion makes the node report command version v (on
// /readyz and in Status) instead of the one it applies: tests use it as an
// in-process stand-in for a node of an older version.
func WithReportedApplyVersion(v uint32) Option { return func(o *options) { o.reportVer = v } }

// WithRaftTransport makes the node use t (for example hashicorp/raft's
// in-memory transport in tests) instead of a TCP transport on RaftListen.
func WithRaftTransport(t raft.Transport) Option { return func(o *options) { o.transport = t } }

// WithForwardClient sets the HTTP client used to forward requests to the
// leader and to reach other members (tests use it to cut the network).
func WithForwardClient(hc *http.Client) Option { return func(o *options) { o.fwdClient = hc } }

// WithBootstrapServers bootstraps a node with an empty data dir as one of
// these initial voters (a static multi-node bring-up; every listed node must
// be given the same list) instead of a one-node cluster.
func WithBootstrapServers(servers []raft.Server) Option {
	return func(o *options) { o.bootstrap = servers }
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegistry registers the server's metrics in r (default: a private
// registry, still served on /metrics).
func WithRegistry(r *prometheus.Registry) Option { return func(o *options) { o.registry = r } }

// WithVersion sets the version string reported by Status.
func WithVersion(v string) Option { return func(o *options) { o.version = v } }

// Server is one running lockd node: the Raft side (internal/node), the
// guard (internal/guard), and the API served over HTTP.
type Server struct {
	cfg    Config
	log    *slog.Logger
	nodeID string
	apiURL string

	nd   *node.Node    // Raft, stores, leadership, membership (internal/node): the assembly's handle
	node lockdapi.Node // the same node as the handlers see it (internal/api)
	api  *lockdapi.Server

	// What the assembly and its tests read of the node, set once by New.
	fsm   *fsm.FSM
	raft  *raft.Raft
	lease *lease.Manager
	hub   *node.Hub // the watch history
	tls   *certs.Store

	guard *guard.Guard // authentication, authorization, limits, audit (internal/guard)

	lis     net.Listener
	httpSrv *http.Server

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// registries returns where the metrics are registered and gathered from:
// the registry given by WithRegistry, else a private one.
func (o *options) registries() (prometheus.Registerer, prometheus.Gatherer) {
	if o.registry == nil {
		r := prometheus.NewRegistry()
		return r, r
	}
	if g, ok := o.registry.(prometheus.Gatherer); ok {
		return o.registry, g
	}
	return o.registry, nil
}

// New opens the data dir, starts Raft and serves the API on cfg.Listen. A
// node whose data dir is empty bootstraps a one-node cluster.
func New(cfg Config, opts ...Option) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	o := options{logger: slog.New(slog.DiscardHandler), version: "dev"}
	for _, opt := range opts {
		opt(&o)
	}
	reg, gatherer := o.registries()
	s := &Server{cfg: cfg, log: o.logger}
	n, err := node.Open(cfg, node.Options{Logger: o.logger, Registry: reg, Transport: o.transport, ForwardClient: o.fwdClient,
		Bootstrap: o.bootstrap, LogStore: o.logStore, Fatal: o.fatal, ReportApplyVersion: o.reportVer})
	if err != nil {
		return nil, err
	}
	p := n.Parts()
	s.nd, s.node, s.nodeID, s.fsm, s.lease, s.hub, s.tls = n, n, n.ID(), p.FSM, p.Lease, p.Hub, p.TLS
	var closers []io.Closer
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i].Close()
			}
		}
	}()
	if s.lis, err = net.Listen("tcp", cfg.Listen); err != nil {
		n.Abort()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	closers = append(closers, s.lis)
	s.apiURL = cfg.Advertise
	if s.apiURL == "" {
		s.apiURL = n.Peers().Scheme() + "://" + s.lis.Addr().String()
	} else if !strings.Contains(s.apiURL, "://") {
		s.apiURL = n.Peers().Scheme() + "://" + s.apiURL
	}

	s.api = lockdapi.New(lockdapi.Deps{Config: cfg, Log: o.logger, Version: o.version, NodeID: s.nodeID, APIURL: s.apiURL,
		Node: n, Parts: p, Registerer: reg, Gatherer: gatherer})
	// The guard after the FSM (it reads the cluster id and session counts).
	if err := s.openGuard(cfg, reg); err != nil {
		n.Abort()
		return nil, err
	}
	closers = append(closers, s.guard)

	if err := n.Start(s.apiURL, s.guard.PeerToken()); err != nil {
		return nil, err
	}
	p = n.Parts()
	s.raft = p.Raft
	s.api.Start(s.guard, node.RaftView{Node: n}, p.Forwarder)
	s.serveHTTP(gatherer)
	s.log.Info("lockd node started", "node_id", s.nodeID, "api", s.apiURL, "raft", n.RaftAddr(), "data_dir", cfg.DataDir)
	return s, nil
}

// Ready reports whether this node is the established leader: the leader of
// an initialized cluster with its lease timers running.
func (s *Server) Ready() bool { return s.node.Ready() }

// ReloadTLS reads the node's certificate, key and CA files again (SIGHUP);
// see node.Node.ReloadTLS.
func (s *Server) ReloadTLS() error { return s.nd.Peers().ReloadTLS() }

// NodeID returns this node's id.
func (s *Server) NodeID() string { return s.nodeID }

// URL returns this node's API URL.
func (s *Server) URL() string { return s.apiURL }

// Addr returns the API listener's address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// RaftAddr returns the Raft transport's address.
func (s *Server) RaftAddr() string { return s.nd.RaftAddr() }

// WaitLeader blocks until this node has become the established leader once
// (Barrier done, lease timers running), or ctx ends.
func (s *Server) WaitLeader(ctx context.Context) error { return s.nd.WaitLeader(ctx) }

// Close stops serving and shuts Raft down. Blocked calls end with an
// unavailable error; clients retry elsewhere.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.nd.Stopping()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.httpSrv.Shutdown(ctx)
		s.httpSrv.Close()
		s.api.CloseUpgraded(ctx)
		s.wg.Wait()
		s.closeErr = errors.Join(s.nd.Close(), s.guard.Close())
		s.log.Info("lockd node stopped", "node_id", s.nodeID)
	})
	return s.closeErr
}
