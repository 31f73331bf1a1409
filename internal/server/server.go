// Package server runs one lockd node: it owns the *raft.Raft, the FSM, the
// leader's lease timers, the API handlers and the HTTP listener. See
// DESIGN.md in this folder.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
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

	dirLock *os.File
	fsm     *fsm.FSM
	wal     *wal.WAL
	meta    *metadb.BoltMetaDB
	trans   raft.Transport
	raft    *raft.Raft
	lease   *lease.Manager
	marks   *lease.Manager
	delays  *lease.Manager
	waiters *waiters
	metrics *metrics
	fwd     *forwarder

	lis     net.Listener
	httpSrv *http.Server

	// leaderMu orders leadership changes: gen counts them, promotedTerm is
	// the term whose Barrier finished and whose lease timers run (0: none).
	leaderMu      sync.Mutex
	leaderGen     uint64
	leaderChanged chan struct{} // closed and replaced on every leadership change
	closing       bool          // Close has begun: start no background task
	promotedTerm  atomic.Uint64

	watch *watchdog
	fatal func(error)

	membershipMu sync.Mutex // one membership change at a time
	restore      []byte     // backup to start a new cluster from (--restore)

	firstReady     chan struct{} // closed when this node first becomes the established leader
	firstReadyOnce sync.Once

	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
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
	reg := o.registry
	var gatherer prometheus.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, gatherer = r, r
	} else if g, ok := reg.(prometheus.Gatherer); ok {
		gatherer = g
	}
	s := &Server{cfg: cfg, log: o.logger, version: o.version, done: make(chan struct{}), firstReady: make(chan struct{}), leaderChanged: make(chan struct{})}
	var closers []io.Closer
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i].Close()
			}
		}
	}()

	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	if s.dirLock, err = lockDir(cfg.DataDir); err != nil {
		return nil, err
	}
	closers = append(closers, s.dirLock)
	if s.nodeID, err = loadNodeID(cfg.DataDir, cfg.NodeID); err != nil {
		return nil, err
	}

	s.lis, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	closers = append(closers, s.lis)
	s.apiURL = cfg.Advertise
	if s.apiURL == "" {
		s.apiURL = "http://" + s.lis.Addr().String()
	} else if !strings.Contains(s.apiURL, "://") {
		s.apiURL = "http://" + s.apiURL
	}

	s.metrics = newMetrics(reg, gatherer)
	s.fwd = newForwarder(o.fwdClient)
	s.watch = newWatchdog(cfg.WatchdogTimeout)
	s.fatal = o.fatal
	if s.fatal == nil {
		s.fatal = func(err error) {
			s.log.Error("fatal: exiting", "err", err)
			os.Exit(1)
		}
	}
	s.waiters = newWaiters(s.metrics.waitersWoken.Inc)
	s.lease = lease.New(cfg.Grace, s.expire)
	// Completion marks end by the same kind of leader timer, without grace:
	// a new leader restarts each retention in full (late, never early).
	s.marks = lease.New(0, s.clearMark)
	s.delays = lease.New(0, s.undelay)
	s.fsm = fsm.New(&observer{lease: s.lease, marks: s.marks, delays: s.delays, waiters: s.waiters})
	s.metrics.registerState(reg, s)

	raftDir := filepath.Join(cfg.DataDir, "raft")
	walDir := filepath.Join(raftDir, "wal")
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return nil, fmt.Errorf("create raft dir: %w", err)
	}
	hl := newHclog(s.log, "raft")
	// raft-wal's Close leaves its metadata DB (and its flock) open, so the
	// server owns the meta store and closes it itself.
	s.meta = &metadb.BoltMetaDB{}
	closers = append(closers, s.meta)
	if s.wal, err = wal.Open(walDir, wal.WithLogger(hl), wal.WithMetaStore(s.meta), wal.WithSegmentSize(cfg.WALSegmentSize)); err != nil {
		return nil, fmt.Errorf("open raft log %s: %w", walDir, err)
	}
	closers = append(closers, s.wal)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, cfg.SnapshotRetain, hl)
	if err != nil {
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(s.nodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = max(cfg.HeartbeatTimeout/2, 5*time.Millisecond)
	rc.CommitTimeout = min(50*time.Millisecond, cfg.HeartbeatTimeout/4)
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	rc.Logger = hl
	notify := make(chan bool, 16)
	rc.NotifyCh = notify

	var ls raft.LogStore = s.wal
	if o.logStore != nil {
		ls = o.logStore(ls)
	}
	logs := newCountingLogStore(ls, reg)
	has, err := raft.HasExistingState(logs, s.wal, snaps)
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
	if o.transport != nil {
		s.trans = o.transport
	} else {
		var adv net.Addr
		if cfg.RaftAdvertise != "" {
			if adv, err = net.ResolveTCPAddr("tcp", cfg.RaftAdvertise); err != nil {
				return nil, fmt.Errorf("raft-advertise %q: %w", cfg.RaftAdvertise, err)
			}
		}
		nt, err := raft.NewTCPTransportWithLogger(cfg.RaftListen, adv, 3, 10*time.Second, hl)
		if err != nil {
			return nil, fmt.Errorf("raft transport on %s: %w", cfg.RaftListen, err)
		}
		s.trans = nt
	}
	if c, ok := s.trans.(io.Closer); ok {
		closers = append(closers, c)
	}
	if !has && len(cfg.Join) == 0 {
		s.log.Info("bootstrapping a new cluster", "node_id", s.nodeID)
		conf := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: s.trans.LocalAddr()}}}
		if len(o.bootstrap) > 0 {
			conf.Servers = o.bootstrap
		}
		if err := raft.BootstrapCluster(rc, logs, s.wal, snaps, s.trans, conf); err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
	}
	if s.raft, err = raft.NewRaft(rc, s.fsm, logs, s.wal, snaps, s.trans); err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}

	s.wg.Add(2)
	go s.watchLeadership(notify)
	go s.runWatchdog()

	s.httpSrv = &http.Server{
		Handler:           s.Handler(gatherer),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second, // request bodies are small
		// A queued Acquire blocks up to MaxPollTimeout after its proposal.
		WriteTimeout: cfg.MaxPollTimeout + cfg.ApplyTimeout + 10*time.Second,
		IdleTimeout:  2 * time.Minute,
	}
	s.httpSrv.Protocols = new(http.Protocols)
	s.httpSrv.Protocols.SetHTTP1(true)
	s.httpSrv.Protocols.SetUnencryptedHTTP2(true)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(s.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("api server stopped", "err", err)
		}
	}()
	s.log.Info("lockd node started", "node_id", s.nodeID, "api", s.apiURL, "raft", string(s.trans.LocalAddr()), "data_dir", cfg.DataDir)
	return s, nil
}

// raftAdvertise is the Raft address peers use to reach this node.
func raftAdvertise(cfg Config) string {
	if cfg.RaftAdvertise != "" {
		return cfg.RaftAdvertise
	}
	return cfg.RaftListen
}

// lockDir takes an exclusive flock on dir/LOCK so two servers cannot share a
// data dir.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another lockd server (%s is locked)", dir, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// loadNodeID returns the node id persisted in dir, writing want (or a new
// random id) on first start. A different want on a later start is refused:
// node ids are never reused or changed.
func loadNodeID(dir, want string) (string, error) {
	path := filepath.Join(dir, "node-id")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		have := strings.TrimSpace(string(b))
		if want != "" && want != have {
			return "", fmt.Errorf("data dir %s belongs to node %q, not %q (node ids never change; use a fresh data dir for a new node)", dir, have, want)
		}
		return have, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("read node id: %w", err)
	}
	id := want
	if id == "" {
		id = randomID(8)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write node id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("write node id: %w", err)
	}
	return id, nil
}

func randomID(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// watchLeadership follows Raft's leadership notifications: a new leader runs
// a Barrier, initializes a new cluster, then starts every session's lease
// timer in full; losing leadership stops every timer at once.
func (s *Server) watchLeadership(notify <-chan bool) {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case isLeader := <-notify:
			s.leaderMu.Lock()
			s.leaderGen++
			gen := s.leaderGen
			close(s.leaderChanged)
			s.leaderChanged = make(chan struct{})
			s.promotedTerm.Store(0)
			s.lease.Demote()
			s.marks.Demote()
			s.delays.Demote()
			s.leaderMu.Unlock()
			if isLeader {
				s.background(func() { s.establish(gen) })
			} else {
				s.log.Info("leadership lost")
			}
		}
	}
}

func (s *Server) establish(gen uint64) {
	for attempt := 0; ; attempt++ {
		select {
		case <-s.done:
			return
		default:
		}
		if s.raft.State() != raft.Leader {
			return
		}
		term := s.raft.CurrentTerm()
		end := s.watch.begin() // a hung disk stalls the Barrier too
		err := s.raft.Barrier(s.cfg.ApplyTimeout).Error()
		end()
		if err == nil && s.fsm.ClusterID() == "" && s.restore != nil {
			var r *fsm.Result
			r, err = s.propose(fsm.CmdRestore, &fsmv1.Restore{Snapshot: s.restore, ClusterId: randomID(16), Epoch: uint64(time.Now().UnixMicro())})
			if err == nil && r.Code != fsm.OK {
				// Apply refused the backup: every retry would too.
				s.fatal(fmt.Errorf("restore from backup %s: %w", s.cfg.Restore, r.Err()))
				return
			}
			if err == nil {
				s.log.Info("cluster restored from backup", "file", s.cfg.Restore, "cluster_id", s.fsm.ClusterID(), "epoch", s.fsm.Info().Epoch)
			}
		}
		if err == nil && s.fsm.ClusterID() == "" {
			_, err = s.propose(fsm.CmdInit, &fsmv1.Init{
				ClusterId:    randomID(16),
				Epoch:        uint64(time.Now().UnixMicro()),
				TimeUnixNano: time.Now().UnixNano(),
			})
		}
		if err == nil {
			err = s.recordSelf()
		}
		if err == nil {
			s.leaderMu.Lock()
			if s.leaderGen == gen && s.raft.State() == raft.Leader && s.raft.CurrentTerm() == term {
				s.fsm.WithSessions(func(ss []fsm.SessionInfo) {
					ls := make([]lease.Entry, len(ss))
					for i, x := range ss {
						ls[i] = lease.Entry{ID: x.ID, TTL: x.TTL, Revoked: x.Revoked}
					}
					s.lease.Promote(term, ls)
				})
				s.fsm.WithMarks(func(ms map[string]fsm.Mark) {
					ls := make([]lease.Entry, 0, len(ms))
					for name, m := range ms {
						ls = append(ls, lease.Entry{ID: markKey(name, m.Token), TTL: m.Retention})
					}
					s.marks.Promote(term, ls)
				})
				s.fsm.WithDelays(func(ds map[string]fsm.Delay) {
					ls := make([]lease.Entry, 0, len(ds))
					for name, d := range ds {
						ls = append(ls, lease.Entry{ID: markKey(name, d.Token), TTL: d.Delay})
					}
					s.delays.Promote(term, ls)
				})
				s.promotedTerm.Store(term)
				s.firstReadyOnce.Do(func() { close(s.firstReady) })
				s.log.Info("leadership established", "term", term, "sessions", s.fsm.Info().Sessions)
			}
			s.leaderMu.Unlock()
			return
		}
		s.log.Warn("leader barrier failed", "err", err, "attempt", attempt)
		select {
		case <-s.done:
			return
		case <-time.After(s.cfg.ElectionTimeout):
		}
	}
}

// expire is the lease manager's callback for a session whose deadline
// passed in leadership term.
func (s *Server) expire(id string, term uint64) {
	if s.proposeTimed(s.lease, id, term, fsm.CmdExpireSession, &fsmv1.ExpireSession{SessionId: id, TimeUnixNano: time.Now().UnixNano(), Term: term}) {
		s.metrics.sessionsExpired.Inc()
		s.log.Info("session expired", "session", id)
	}
}

// proposeTimed proposes the command a leader timer of manager m decided
// (for key, in leadership term): only while this node still leads in that
// term (verified after the timer fired), and bound to that term so Apply
// ignores it if it commits in a later one. A failed proposal is retried
// after an election timeout if the node still leads.
func (s *Server) proposeTimed(m *lease.Manager, key string, term uint64, t fsm.CmdType, msg proto.Message) bool {
	// Under leaderMu: establish holds it from Promote until it records the
	// promoted term, so a timer firing in between waits instead of being
	// dropped (and its entry left expiring for the whole term).
	s.leaderMu.Lock()
	current := s.promotedTerm.Load()
	s.leaderMu.Unlock()
	if current != term {
		return false
	}
	if err := s.linearizable(); err != nil {
		return false // no longer leader: Demote clears the timers
	}
	if _, err := s.propose(t, msg); err != nil {
		s.log.Warn("propose of a timed command failed", "type", t, "key", key, "err", err)
		m.Retry(key, s.cfg.ElectionTimeout)
		return false
	}
	return true
}

// background runs f in a goroutine Close waits for, unless Close has begun.
func (s *Server) background(f func()) bool {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// clearMark is the marks manager's callback for a completion mark whose
// retention passed.
func (s *Server) clearMark(key string, term uint64) {
	name, token, ok := parseMarkKey(key)
	if ok && s.proposeTimed(s.marks, key, term, fsm.CmdClearMark, &fsmv1.ClearMark{Name: name, Token: token, Term: term}) {
		s.log.Info("completion mark expired", "lock", name, "token", token)
	}
}

// undelay is the lock-delay manager's callback: the delay started by an
// expired hold (key: lock and that hold's token) has run in full on this
// leader; grant again.
func (s *Server) undelay(key string, term uint64) {
	if name, token, ok := parseMarkKey(key); ok {
		s.proposeTimed(s.delays, key, term, fsm.CmdUndelay, &fsmv1.Undelay{Name: name, Token: token, Term: term, TimeUnixNano: time.Now().UnixNano()})
	}
}

// leadershipChanges returns a channel closed at the next leadership change
// of this node (gained or lost).
func (s *Server) leadershipChanges() <-chan struct{} {
	s.leaderMu.Lock()
	defer s.leaderMu.Unlock()
	return s.leaderChanged
}

// propose appends a command to the Raft log and returns the FSM's result
// once it is committed and applied here.
func (s *Server) propose(t fsm.CmdType, m proto.Message) (*fsm.Result, error) {
	b, err := fsm.Encode(t, m)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	end := s.watch.begin()
	defer end()
	f := s.raft.Apply(b, s.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return nil, err
	}
	s.metrics.applyDuration.Observe(time.Since(start).Seconds())
	r, ok := f.Response().(*fsm.Result)
	if !ok {
		return nil, fmt.Errorf("unexpected apply response %T", f.Response())
	}
	return r, nil
}

// linearizable makes a read on this node linearizable: this node must be the
// leader of a term whose Barrier has finished (so every entry an earlier
// leader acknowledged is applied here), still leader after the request was
// received (VerifyLeader), and in the same term. Every write acknowledged
// before the read began is then applied in the FSM.
func (s *Server) linearizable() error {
	term := s.promotedTerm.Load()
	if term == 0 {
		return raft.ErrNotLeader
	}
	end := s.watch.begin() // VerifyLeader runs on the leader loop a hung disk blocks
	err := s.raft.VerifyLeader().Error()
	end()
	if err != nil {
		return err
	}
	if s.raft.CurrentTerm() != term || s.promotedTerm.Load() != term {
		return raft.ErrLeadershipLost
	}
	return nil
}

// NodeID returns this node's id.
func (s *Server) NodeID() string { return s.nodeID }

// URL returns this node's API URL.
func (s *Server) URL() string { return s.apiURL }

// Addr returns the API listener's address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Ready reports whether this node is the established leader: the leader of
// an initialized cluster with its lease timers running.
func (s *Server) Ready() bool {
	return s.promotedTerm.Load() != 0 && s.fsm.ClusterID() != ""
}

// notReady says why this node cannot serve clients now, or "" when it can:
// as the established leader, or as a follower that knows the leader's API
// and forwards to it.
func (s *Server) notReady() string {
	if s.Ready() {
		return ""
	}
	if s.raft.State() == raft.Leader {
		return "leader not established yet"
	}
	if _, err := s.leaderURL(http.Header{}); err != nil {
		return "no leader known"
	}
	return ""
}

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
		var errs []error
		if err := s.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		s.lease.Demote()
		s.marks.Demote()
		s.delays.Demote()
		s.wg.Wait()
		if c, ok := s.trans.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
		errs = append(errs, s.wal.Close(), s.meta.Close(), s.dirLock.Close())
		s.closeErr = errors.Join(errs...)
		s.log.Info("lockd node stopped", "node_id", s.nodeID)
	})
	return s.closeErr
}

// RaftAddr returns the Raft transport's address.
func (s *Server) RaftAddr() string { return string(s.trans.LocalAddr()) }
