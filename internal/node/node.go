package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
)

// Options are what the assembly (internal/server) hands a node besides its
// Config.
type Options struct {
	// Logger logs the node's events (required).
	Logger *slog.Logger
	// Registry registers the node's metrics (required).
	Registry prometheus.Registerer
	// Transport, when set, replaces the TCP (or TLS) Raft transport.
	Transport raft.Transport
	// ForwardClient, when set, is the HTTP client for calls to other members.
	ForwardClient *http.Client
	// Bootstrap, when set, are the initial voters of a new cluster.
	Bootstrap []raft.Server
	// LogStore, when set, wraps the Raft log store (tests make it hang).
	LogStore func(raft.LogStore) raft.LogStore
	// Fatal is called when the node must stop (default: log and exit).
	Fatal func(error)
	// ReportApplyVersion, when set, is the command version the node
	// reports instead of the one it applies (tests: an older node).
	ReportApplyVersion uint32
}

// Node is the Raft side of one lockd node: the data dir, Raft and its
// stores, the FSM and what follows it (lease timers, waiters, the watch
// history), leadership, membership and the clients to other members.
type Node struct {
	cfg    Config
	log    *slog.Logger
	nodeID string
	apiURL string

	dirLock *os.File
	fsm     *fsm.FSM
	wal     *wal.WAL
	meta    *metadb.BoltMetaDB
	trans   raft.Transport
	raft    *raft.Raft
	lease   *lease.Manager
	marks   *lease.Manager
	delays  *lease.Manager
	holds   *lease.Manager // hold budgets, keyed by holdKey (budget.go)
	graces  *lease.Manager // revoke graces, keyed by holdKey (revoke.go)
	waiters *Waiters
	notices *Notices
	metrics *metrics
	fwd     *Forwarder
	hub     *Hub // the watch history (watch_hub.go)

	peerAddrs peerAddrs   // the other members' addresses given as names, resolved
	raftUp    atomic.Bool // s.raft is set (the Raft port may ask raftMember before)

	tls        *certs.Store // nil: plaintext
	clientAuth certs.ClientAuth
	peers      peerCache // VerifyPeer's answers

	// leaderMu orders leadership changes: gen counts them, promotedTerm is
	// the term whose Barrier finished and whose lease timers run (0: none).
	leaderMu      sync.Mutex
	leaderGen     uint64
	leaderChanged chan struct{} // closed and replaced on every leadership change
	closing       bool          // Close has begun: start no background task
	promotedTerm  atomic.Uint64

	watch   *watchdog
	verify  Verifier // shares VerifyLeader among concurrent requests
	logSize *logSize // log bytes since the last snapshot (snapshots.go)
	fatal   func(error)

	acks ackTracker // replies to this node's AppendEntries, for leadership checks (acks.go)
	vers versions   // the version gate (version.go)

	membershipMu sync.Mutex // one membership change at a time
	restore      []byte     // backup to start a new cluster from (--restore)

	firstReady     chan struct{} // closed when this node first becomes the established leader
	firstReadyOnce sync.Once

	// raftMu lets Close wait for the calls waiting on a Raft future
	// (raftCall) before it shuts Raft down; raftClosed refuses new ones.
	raftMu     sync.RWMutex
	raftClosed bool

	o       Options
	closers []io.Closer // closed, last first, when Start fails
	done    chan struct{}
	wg      sync.WaitGroup
}

// exit is the default of Options.Fatal: log and end the process.
func exit(log *slog.Logger) func(error) {
	return func(err error) {
		log.Error("fatal: exiting", "err", err)
		os.Exit(1)
	}
}

// Open opens the data dir (locking it, reading or creating the node id)
// and the TLS files, and builds the FSM and what follows it. Raft starts
// with Start, once the API's address is known. On error, nothing stays
// open.
func Open(cfg Config, o Options) (_ *Node, err error) {
	s := &Node{cfg: cfg, log: o.Logger, o: o, done: make(chan struct{}), firstReady: make(chan struct{}), leaderChanged: make(chan struct{})}
	defer func() {
		if err != nil {
			s.Abort()
		}
	}()
	if err := s.openDataDir(cfg); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, s.dirLock)
	if err := (Peers{s}).openTLS(cfg); err != nil {
		return nil, err
	}
	s.metrics = newMetrics(o.Registry)
	s.watch = newWatchdog(cfg.WatchdogTimeout)
	s.fatal = o.Fatal
	if s.fatal == nil {
		s.fatal = exit(s.log)
	}
	s.waiters = NewWaiters(s.metrics.waitersWoken.Inc)
	timers := leaderTimers{s}
	s.lease = lease.New(cfg.Grace, timers.expire)
	// Completion marks end by the same kind of leader timer, without grace:
	// a new leader restarts each retention in full (late, never early).
	s.marks = lease.New(0, timers.clearMark)
	s.delays = lease.New(0, timers.undelay)
	s.holds = lease.New(0, timers.endHold)
	s.graces = lease.New(0, timers.revokeHold)
	s.hub = NewHub(cfg.WatchHistory)
	s.notices = NewNotices()
	s.fsm = fsm.New(&Fanout{Lease: s.lease, Marks: s.marks, Delays: s.delays, Holds: s.holds, Graces: s.graces, Waiters: s.waiters, Notices: s.notices, Hub: s.hub})
	s.fsm.OnClusterVersion(versionGate{s}.clusterVersionChanged)
	s.vers.reported.Store(o.ReportApplyVersion)
	return s, nil
}

// Abort closes what Open (and a failed Start) opened, last first: for an
// assembly that fails before Start, and for a failed Start.
func (s *Node) Abort() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i].Close()
	}
	s.closers = nil
}

// Start joins or bootstraps the cluster as needed and starts Raft. apiURL
// is this node's API URL (members forward to it); peerToken, when set, is
// presented on every call to another member. On error the node is closed
// (everything Open opened too).
func (s *Node) Start(apiURL, peerToken string) (err error) {
	defer func() {
		if err != nil {
			s.Abort()
		}
	}()
	cfg, o := s.cfg, &s.o
	s.apiURL = apiURL
	s.fwd = newForwarder(o.ForwardClient, s.tls, peerToken)

	hl := NewHclog(s.log, "raft")
	stores, err := s.openStores(cfg, o, hl, o.Registry, &s.closers)
	if err != nil {
		return err
	}
	notify := make(chan bool, 16)
	rc := s.raftConfig(cfg, hl, notify)
	has, err := raft.HasExistingState(stores.logs, s.wal, stores.snaps)
	if err != nil {
		return fmt.Errorf("read raft state: %w", err)
	}
	if cfg.Restore != "" {
		if has {
			return fmt.Errorf("--restore needs an empty data dir; %s has Raft state", cfg.DataDir)
		}
		b, err := os.ReadFile(cfg.Restore)
		if err != nil {
			return fmt.Errorf("read backup: %w", err)
		}
		if err := fsm.CheckBackup(b); err != nil {
			return fmt.Errorf("backup %s: %w", cfg.Restore, err)
		}
		s.restore = b
	}
	if !has && len(cfg.Join) > 0 {
		// Join before opening the Raft port: the leader first removes any
		// stale member with this id or address, so this empty node never
		// takes part in Raft under an old identity.
		ctx, cancel := context.WithTimeout(context.Background(), cfg.JoinTimeout)
		err := Membership{s}.joinCluster(ctx, cfg.Join, RaftAdvertise(cfg))
		cancel()
		if err != nil {
			return fmt.Errorf("join cluster: %w", err)
		}
	} else if has && len(cfg.Join) > 0 {
		s.log.Info("data dir has state: resuming, --join ignored")
	}
	if s.trans, err = openTransport(cfg, o, s.tls, hl, Peers{s}.raftMember); err != nil {
		return err
	}
	s.trans = trackAcks(s.trans, &s.acks)
	if c, ok := s.trans.(io.Closer); ok {
		s.closers = append(s.closers, c)
	}
	if !has && len(cfg.Join) == 0 {
		s.log.Info("bootstrapping a new cluster", "node_id", s.nodeID)
		conf := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: s.trans.LocalAddr()}}}
		if len(o.Bootstrap) > 0 {
			conf.Servers = o.Bootstrap
		}
		if err := raft.BootstrapCluster(rc, stores.logs, stores.stable, stores.snaps, s.trans, conf); err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
	}
	// NewRaft reads the log after the snapshot: kept for the node's
	// second read of it (replay.go).
	stores.logs.replay.fill(true)
	s.raft, err = raft.NewRaft(rc, s.fsm, stores.logs, stores.stable, stores.snaps, s.trans)
	stores.logs.replay.fill(false)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	s.raftUp.Store(true)

	s.wg.Add(5)
	go func() { // what the apply did not read goes (replay.go)
		defer s.wg.Done()
		select {
		case <-s.done:
		case <-time.After(time.Minute):
		}
		stores.logs.replay.release()
	}()
	go func() { defer s.wg.Done(); s.metrics.lock.countLeaderChanges(s.raft, s.done, s.fwd.leaderChanged) }()
	go leadership{s}.watchLeadership(notify)
	go s.runWatchdog()
	go s.snapshotByLogSize(s.logSize)
	return nil
}

// WaitLeader blocks until this node has become the established leader once
// (Barrier done, lease timers running), or ctx ends.
func (s *Node) WaitLeader(ctx context.Context) error {
	select {
	case <-s.firstReady:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errors.New("server closed")
	}
}

// Stopping hands leadership over (when this node leads) and stops every
// background task from starting; the first half of Close, before the API
// stops serving.
func (s *Node) Stopping() {
	leadership{s}.transferOnShutdown()
	s.leaderMu.Lock()
	s.closing = true // no background task starts after this
	s.leaderMu.Unlock()
	close(s.done)
}

// Close shuts Raft down and closes the stores and the data dir. Stopping
// must have been called first.
func (s *Node) Close() error {
	s.fwd.close()
	s.raftMu.Lock()
	s.raftClosed = true
	s.raftMu.Unlock()
	var errs []error
	if err := s.raft.Shutdown().Error(); err != nil {
		errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
	}
	leaderTimers{s}.demoteTimers()
	s.wg.Wait()
	if c, ok := s.trans.(interface{ CloseStreams() }); ok {
		// Hang up the pooled connections to peers: NetworkTransport's
		// Close leaves them open, and the peers' goroutines reading.
		c.CloseStreams()
	}
	if c, ok := s.trans.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	errs = append(errs, s.wal.Close(), s.meta.Close(), s.dirLock.Close())
	return errors.Join(errs...)
}
