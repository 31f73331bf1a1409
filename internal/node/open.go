package node

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/lockd-dev/lockd/internal/certs"
)

// This file opens what a node keeps on disk and talks to Raft through: the
// data dir (its lock and the node id), the Raft log, stable and snapshot
// stores, Raft's configuration and its transport.

// openDataDir creates and flocks the data dir and loads the node id.
func (s *Node) openDataDir(cfg Config) error {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	var err error
	if s.dirLock, err = lockDir(cfg.DataDir); err != nil {
		return err
	}
	if s.nodeID, err = loadNodeID(cfg.DataDir, cfg.NodeID); err != nil {
		s.dirLock.Close()
		return err
	}
	return nil
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
		id = RandomID(8)
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

// RandomID returns n random bytes in hex (ids, secrets).
func RandomID(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// raftStores are the stores Raft runs on.
type raftStores struct {
	logs   *countingLogStore // the WAL, wrapped (counting, and by WithLogStoreWrapper)
	stable raft.StableStore  // the WAL
	snaps  raft.SnapshotStore
}

// openStores opens the Raft log (raft-wal, with a metadata store the server
// owns) and the snapshot store under the data dir; every store it opened is
// appended to closers.
func (s *Node) openStores(cfg Config, o *Options, hl hclog.Logger, reg prometheus.Registerer, closers *[]io.Closer) (raftStores, error) {
	raftDir := filepath.Join(cfg.DataDir, "raft")
	walDir := filepath.Join(raftDir, "wal")
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return raftStores{}, fmt.Errorf("create raft dir: %w", err)
	}
	// raft-wal's Close leaves its metadata DB (and its flock) open, so the
	// server owns the meta store and closes it itself.
	s.meta = &metadb.BoltMetaDB{}
	*closers = append(*closers, s.meta)
	var err error
	if s.wal, err = wal.Open(walDir, wal.WithLogger(hl), wal.WithMetaStore(s.meta), wal.WithSegmentSize(cfg.WALSegmentSize)); err != nil {
		return raftStores{}, fmt.Errorf("open raft log %s: %w", walDir, err)
	}
	*closers = append(*closers, s.wal)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, cfg.SnapshotRetain, hl)
	if err != nil {
		return raftStores{}, fmt.Errorf("open snapshot store: %w", err)
	}
	// A test-only slow or hung disk (diskhook_fault.go); nothing is
	// wrapped in a release build.
	ls, stable := WrapDisk(s.wal, s.wal)
	if o.LogStore != nil {
		ls = o.LogStore(ls)
	}
	size := newLogSize(cfg.SnapshotLogBytes)
	size.seedState(snaps)
	s.logSize = size
	return raftStores{logs: newCountingLogStore(ls, reg, size), stable: stable, snaps: &sizedSnapshotStore{SnapshotStore: snaps, size: size, m: s.metrics.lock}}, nil
}

// raftConfig is Raft's configuration for this node; leadership changes are
// reported on notify.
func (s *Node) raftConfig(cfg Config, hl hclog.Logger, notify chan bool) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(s.nodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	// Raft's leader lease only decides when a leader that hears no quorum
	// steps down; lockd's reads and KeepAlives rely on VerifyLeader, not on
	// it. The longest lease Raft allows keeps a busy leader from stepping
	// down for a stall of a few heartbeats.
	rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout
	rc.CommitTimeout = min(50*time.Millisecond, cfg.HeartbeatTimeout/4)
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	rc.Logger = hl
	rc.NotifyCh = notify
	return rc
}

// openTransport returns the Raft transport: the one given by
// WithRaftTransport, else TCP on RaftListen, over mutual TLS when store is
// not nil; member reports another member's address (the TLS Raft port's
// handshake caps spare it).
func openTransport(cfg Config, o *Options, store *certs.Store, hl hclog.Logger, member func(netip.Addr) bool) (raft.Transport, error) {
	if o.Transport != nil {
		return o.Transport, nil
	}
	var adv net.Addr
	if cfg.RaftAdvertise != "" {
		var err error
		if adv, err = net.ResolveTCPAddr("tcp", cfg.RaftAdvertise); err != nil {
			return nil, fmt.Errorf("raft-advertise %q: %w", cfg.RaftAdvertise, err)
		}
	}
	if store != nil {
		return OpenTLSTransport(cfg, store, adv, hl, member)
	}
	nt, err := raft.NewTCPTransportWithLogger(cfg.RaftListen, adv, 3, 10*time.Second, hl)
	if err != nil {
		return nil, fmt.Errorf("raft transport on %s: %w", cfg.RaftListen, err)
	}
	return nt, nil
}

// countingLogStore counts the batches and entries written to the Raft log.
// Each StoreLogs call is one write and one fsync, so entries per batch is
// the group-commit factor (lockd_raft_log_entries_total /
// lockd_raft_log_batches_total).
type countingLogStore struct {
	raft.LogStore
	batches, entries prometheus.Counter
	size             *logSize
	replay           replayCache // replay.go
}

func newCountingLogStore(ls raft.LogStore, reg prometheus.Registerer, size *logSize) *countingLogStore {
	c := &countingLogStore{
		LogStore: ls,
		size:     size,
		batches:  prometheus.NewCounter(prometheus.CounterOpts{Name: "lockd_raft_log_batches_total", Help: "Batches written (and fsynced) to the Raft log."}),
		entries:  prometheus.NewCounter(prometheus.CounterOpts{Name: "lockd_raft_log_entries_total", Help: "Entries written to the Raft log."}),
	}
	reg.MustRegister(c.batches, c.entries)
	return c
}

// StoreLog counts one batch of one entry.
func (c *countingLogStore) StoreLog(l *raft.Log) error {
	return c.StoreLogs([]*raft.Log{l})
}

// StoreLogs counts one batch.
func (c *countingLogStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) > 0 {
		c.replay.changing(logs[0].Index, math.MaxUint64)
	}
	if err := c.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	c.batches.Inc()
	c.entries.Add(float64(len(logs)))
	var n uint64
	for _, l := range logs {
		n += uint64(len(l.Data))
	}
	c.size.wrote(n)
	return nil
}

// GetLog reads entry i, from the replay cache when it holds it.
func (c *countingLogStore) GetLog(i uint64, l *raft.Log) error {
	if c.replay.take(i, l) {
		return nil
	}
	if err := c.LogStore.GetLog(i, l); err != nil {
		return err
	}
	c.replay.keep(l)
	return nil
}

// DeleteRange deletes entries min to max, and first any the replay cache
// keeps.
func (c *countingLogStore) DeleteRange(min, max uint64) error {
	c.replay.changing(min, max)
	return c.LogStore.DeleteRange(min, max)
}

// IsMonotonic passes on the wrapped store's raft.MonotonicLogStore answer.
// Without it, hashicorp/raft would treat raft-wal as non-monotonic and keep
// a follower's old log after installing a snapshot, which raft-wal then
// refuses to append to: the follower would never catch up.
func (c *countingLogStore) IsMonotonic() bool {
	m, ok := c.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
