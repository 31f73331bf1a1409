// Package server runs one lockd node: it owns the *raft.Raft, the FSM, the
// leader's lease timers, the API handlers and the HTTP listener. See
// DESIGN.md in this folder.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/lease"
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

// Server is one running lockd node.
type Server struct {
	cfg     Config
	log     *slog.Logger
	version string
	nodeID  string
	apiURL  string

	dirLock   *os.File
	fsm       *fsm.FSM
	wal       *wal.WAL
	meta      *metadb.BoltMetaDB
	trans     raft.Transport
	raft      *raft.Raft
	lease     *lease.Manager
	marks     *lease.Manager
	delays    *lease.Manager
	holds     *lease.Manager // hold budgets, keyed by holdKey (budget.go)
	waiters   *waiters
	metrics   *metrics
	fwd       *forwarder
	hub       *hub          // the watch history (watch_hub.go)
	keepalive time.Duration // watchKeepalive; shorter in tests

	guard *guard.Guard // authentication, authorization, limits, audit (internal/guard)

	lis     net.Listener
	httpSrv *http.Server

	peerAddrs peerAddrs   // the other members' addresses given as names, resolved
	raftUp    atomic.Bool // s.raft is set (the Raft port may ask raftMember before)

	tls        *certs.Store // nil: plaintext
	clientAuth certs.ClientAuth
	peers      peerCache // verifyPeer's answers

	// leaderMu orders leadership changes: gen counts them, promotedTerm is
	// the term whose Barrier finished and whose lease timers run (0: none).
	leaderMu      sync.Mutex
	leaderGen     uint64
	leaderChanged chan struct{} // closed and replaced on every leadership change
	closing       bool          // Close has begun: start no background task
	promotedTerm  atomic.Uint64

	watch   *watchdog
	verify  verifier // shares VerifyLeader among concurrent requests
	logSize *logSize // log bytes since the last snapshot (snapshots.go)
	fatal   func(error)

	acks ackTracker // replies to this node's AppendEntries, for leadership checks (acks.go)

	membershipMu sync.Mutex // one membership change at a time
	restore      []byte     // backup to start a new cluster from (--restore)

	firstReady     chan struct{} // closed when this node first becomes the established leader
	firstReadyOnce sync.Once

	// raftMu lets Close wait for the calls waiting on a Raft future
	// (raftCall) before it shuts Raft down; raftClosed refuses new ones.
	raftMu     sync.RWMutex
	raftClosed bool

	done      chan struct{}
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

// exit is the default of WithFatal: log and end the process.
func (s *Server) exit(err error) {
	s.log.Error("fatal: exiting", "err", err)
	os.Exit(1)
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
	s := &Server{cfg: cfg, log: o.logger, version: o.version, done: make(chan struct{}), firstReady: make(chan struct{}), leaderChanged: make(chan struct{})}
	var closers []io.Closer
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i].Close()
			}
		}
	}()

	if err := s.openDataDir(cfg); err != nil {
		return nil, err
	}
	closers = append(closers, s.dirLock)
	if err := s.openTLS(cfg); err != nil {
		return nil, err
	}
	if s.lis, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	closers = append(closers, s.lis)
	s.apiURL = cfg.Advertise
	if s.apiURL == "" {
		s.apiURL = s.scheme() + "://" + s.lis.Addr().String()
	} else if !strings.Contains(s.apiURL, "://") {
		s.apiURL = s.scheme() + "://" + s.apiURL
	}

	s.metrics = newMetrics(reg, gatherer)
	s.watch = newWatchdog(cfg.WatchdogTimeout)
	s.fatal = o.fatal
	if s.fatal == nil {
		s.fatal = s.exit
	}
	s.waiters = newWaiters(s.metrics.waitersWoken.Inc)
	s.lease = lease.New(cfg.Grace, s.expire)
	// Completion marks end by the same kind of leader timer, without grace:
	// a new leader restarts each retention in full (late, never early).
	s.marks = lease.New(0, s.clearMark)
	s.delays = lease.New(0, s.undelay)
	s.holds = lease.New(0, s.endHold)
	s.hub, s.keepalive = newHub(cfg.WatchHistory), watchKeepalive
	s.fsm = fsm.New(&fanout{lease: s.lease, marks: s.marks, delays: s.delays, holds: s.holds, waiters: s.waiters, hub: s.hub})
	// The guard after the FSM (it reads the cluster id and session counts).
	if err := s.openGuard(cfg, reg); err != nil {
		return nil, err
	}
	closers = append(closers, s.guard)
	s.fwd = newForwarder(o.fwdClient, s.tls, s.guard.PeerToken())
	s.metrics.registerState(reg, s)

	hl := newHclog(s.log, "raft")
	stores, err := s.openStores(cfg, &o, hl, reg, &closers)
	if err != nil {
		return nil, err
	}
	notify := make(chan bool, 16)
	rc := s.raftConfig(cfg, hl, notify)
	has, err := raft.HasExistingState(stores.logs, s.wal, stores.snaps)
	if err != nil {
		return nil, fmt.Errorf("read raft state: %w", err)
	}
	if cfg.Restore != "" {
		if has {
			return nil, fmt.Errorf("--restore needs an empty data dir; %s has Raft state", cfg.DataDir)
		}
		b, err := os.ReadFile(cfg.Restore)
		if err != nil {
			return nil, fmt.Errorf("read backup: %w", err)
		}
		if err := fsm.CheckBackup(b); err != nil {
			return nil, fmt.Errorf("backup %s: %w", cfg.Restore, err)
		}
		s.restore = b
	}
	if !has && len(cfg.Join) > 0 {
		// Join before opening the Raft port: the leader first removes any
		// stale member with this id or address, so this empty node never
		// takes part in Raft under an old identity.
		ctx, cancel := context.WithTimeout(context.Background(), cfg.JoinTimeout)
		err := s.joinCluster(ctx, cfg.Join, raftAdvertise(cfg))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("join cluster: %w", err)
		}
	} else if has && len(cfg.Join) > 0 {
		s.log.Info("data dir has state: resuming, --join ignored")
	}
	if s.trans, err = openTransport(cfg, &o, s.tls, hl, s.raftMember); err != nil {
		return nil, err
	}
	s.trans = trackAcks(s.trans, &s.acks)
	if c, ok := s.trans.(io.Closer); ok {
		closers = append(closers, c)
	}
	if !has && len(cfg.Join) == 0 {
		s.log.Info("bootstrapping a new cluster", "node_id", s.nodeID)
		conf := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: s.trans.LocalAddr()}}}
		if len(o.bootstrap) > 0 {
			conf.Servers = o.bootstrap
		}
		if err := raft.BootstrapCluster(rc, stores.logs, stores.stable, stores.snaps, s.trans, conf); err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
	}
	if s.raft, err = raft.NewRaft(rc, s.fsm, stores.logs, stores.stable, stores.snaps, s.trans); err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	s.raftUp.Store(true)

	s.wg.Add(4)
	go func() { defer s.wg.Done(); s.metrics.lock.countLeaderChanges(s.raft, s.done, s.fwd.leaderChanged) }()
	go s.watchLeadership(notify)
	go s.runWatchdog()
	go s.snapshotByLogSize(s.logSize)
	s.serveHTTP(gatherer)
	s.log.Info("lockd node started", "node_id", s.nodeID, "api", s.apiURL, "raft", string(s.trans.LocalAddr()), "data_dir", cfg.DataDir)
	return s, nil
}

// NodeID returns this node's id.
func (s *Server) NodeID() string { return s.nodeID }

// URL returns this node's API URL.
func (s *Server) URL() string { return s.apiURL }

// Addr returns the API listener's address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// RaftAddr returns the Raft transport's address.
func (s *Server) RaftAddr() string { return string(s.trans.LocalAddr()) }

// WaitLeader blocks until this node has become the established leader once
// (Barrier done, lease timers running), or ctx ends.
func (s *Server) WaitLeader(ctx context.Context) error {
	select {
	case <-s.firstReady:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errors.New("server closed")
	}
}

// Close stops serving and shuts Raft down. Blocked calls end with an
// unavailable error; clients retry elsewhere.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.transferOnShutdown()
		s.leaderMu.Lock()
		s.closing = true // no background task starts after this
		s.leaderMu.Unlock()
		close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.httpSrv.Shutdown(ctx)
		s.httpSrv.Close()
		s.fwd.close()
		s.raftMu.Lock()
		s.raftClosed = true
		s.raftMu.Unlock()
		var errs []error
		if err := s.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		s.demoteTimers()
		s.wg.Wait()
		if c, ok := s.trans.(interface{ CloseStreams() }); ok {
			// Hang up the pooled connections to peers: NetworkTransport's
			// Close leaves them open, and the peers' goroutines reading.
			c.CloseStreams()
		}
		if c, ok := s.trans.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
		errs = append(errs, s.wal.Close(), s.meta.Close(), s.dirLock.Close(), s.guard.Close())
		s.closeErr = errors.Join(errs...)
		s.log.Info("lockd node stopped", "node_id", s.nodeID)
	})
	return s.closeErr
}
