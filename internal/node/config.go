package node

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/lockd-dev/lockd/internal/guard"
)

// Config is a node's configuration. Every field maps 1:1 to a `lockd serve`
// flag of the same name in kebab case.
type Config struct {
	// DataDir holds the Raft log, snapshots, the node id and the lock file.
	// Default "./lockd-data".
	DataDir string
	// Listen is the API address (Connect, JSON, /metrics, /healthz, /readyz).
	// Default "127.0.0.1:7070".
	Listen string
	// RaftListen is the Raft transport address. Default "127.0.0.1:7071".
	RaftListen string
	// Advertise is the API URL other nodes and clients use to reach this node;
	// default derived from Listen. Required when Listen is a wildcard address.
	Advertise string
	// RaftAdvertise is the Raft address peers use; default RaftListen.
	// Required when RaftListen is a wildcard address.
	RaftAdvertise string
	// NodeID names this node. Persisted in the data dir on first start; a
	// later start with a different value is refused. Default: a random id.
	NodeID string
	// Join lists API URLs of existing members. A node with an empty data dir
	// asks them (any member; followers forward to the leader) to add it,
	// before it opens its Raft port. A node with existing data ignores it.
	Join []string
	// Restore is a backup file (from `lockd snapshot save`) that a node with
	// an empty data dir bootstraps a new cluster from: new cluster id, tokens
	// above every token of the backup.
	Restore string
	// JoinTimeout bounds the retries of a join. Default 1m.
	JoinTimeout time.Duration

	// HeartbeatTimeout is Raft's follower timeout before an election (the
	// leader sends heartbeats ten times as often). Default 400ms: a killed
	// leader is replaced in under 2 s at p99 (1 s at 1s), with eight missed
	// heartbeats before a follower gives up, so a loaded 2-core box does
	// not flap.
	HeartbeatTimeout time.Duration
	// ElectionTimeout is Raft's candidate timeout. Default 400ms.
	ElectionTimeout time.Duration
	// Grace is added to every session deadline on the leader (TTL is a lower
	// bound of a lease). Default: ElectionTimeout.
	Grace time.Duration

	// DefaultTTL is the session TTL when a client asks none. Default 10s.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound the TTLs a client may ask. Default 1s and 1h.
	MinTTL, MaxTTL time.Duration
	// MaxPollTimeout caps how long one queued Acquire call blocks before it
	// answers QUEUED. Default 30s.
	MaxPollTimeout time.Duration
	// ApplyTimeout bounds one Raft proposal. Default 10s.
	ApplyTimeout time.Duration

	// WatchdogTimeout is how long a proposal may wait on the leader before
	// the watchdog stops the node: a hung disk does not stop Raft
	// heartbeats, so without it the cluster would wait forever.
	// Default 10s.
	WatchdogTimeout time.Duration

	// SnapshotInterval is how often Raft checks whether to snapshot.
	// Default 2m.
	SnapshotInterval time.Duration
	// SnapshotThreshold is how many log entries since the last snapshot
	// trigger a new one. Default 8192.
	SnapshotThreshold uint64
	// SnapshotLogBytes takes a snapshot as soon as this many bytes of
	// entries were written to the Raft log since the last one, whatever
	// SnapshotInterval and SnapshotThreshold say: it bounds the log a
	// restart replays (2 MiB is about 47 000 lock entries, under a second
	// to replay), so a restart stays well inside a TTL under any write
	// rate. A snapshot costs CPU and memory in proportion to the state
	// (about 1 s and 90 MB for 1 000 000 locks), so the log must also reach
	// an eighth of the last snapshot's size (snapshots_state.go): the
	// snapshot work per byte written stays bounded, and a restart replays
	// at most that much log beside the snapshot it loads. 0 turns it off.
	// Default 2 MiB.
	SnapshotLogBytes uint64
	// TrailingLogs is how many log entries are kept after a snapshot, so a
	// follower slightly behind catches up from the log instead of a whole
	// snapshot. Default 10240.
	TrailingLogs uint64
	// WALSegmentSize is the size in bytes of one Raft log segment file. The
	// log is truncated after a snapshot by deleting whole segments, so
	// smaller segments free disk sooner. Default 64 MiB.
	WALSegmentSize int
	// SnapshotRetain is how many snapshots are kept on disk. Default 2.
	SnapshotRetain int

	// WatchHistory is how many recent lock events the node keeps in memory
	// for the watch stream: a watcher resumes without a reset from any
	// position among them. About 150 bytes an event plus its value (a
	// value is at most 1 KiB). Default 16384.
	WatchHistory int
	// WatchBuffer is how many events one watch stream copies out of the
	// history at a time: its own memory. A stream whose consumer is so slow
	// that its position leaves the history gets a reset. Default 256.
	WatchBuffer int
	// TLSCert is this node's certificate (PEM file), served on the API and
	// Raft ports and presented to peers. TLSCert, TLSKey and TLSCA together
	// turn TLS on for the API, Raft, forwarding and joins; peers then need
	// a certificate from TLSCA (mutual TLS). Default: none (plaintext).
	TLSCert string
	// TLSKey is TLSCert's private key (PEM file).
	TLSKey string
	// TLSCA is the cluster CA (PEM file): peers' certificates must chain to
	// it, and clients' too unless TLSClientCA is given.
	TLSCA string
	// TLSClientCA is the CA of client certificates when it is not TLSCA.
	// It never makes a client a peer. Default: TLSCA.
	TLSClientCA string
	// TLSClientAuth is what the API asks of clients: "none" (no
	// certificate needed), "verify-if-given" or "require" (a certificate
	// from TLSClientCA). Default "none".
	TLSClientAuth string
	// Insecure lets the node listen on a non-loopback address without TLS,
	// which it otherwise refuses. Default false.
	Insecure bool

	// AllowedHosts are host names the API and pprof answer beside the
	// node's own (IP literals, localhost and *.localhost, the hosts of
	// Listen, Advertise and RaftAdvertise, the DNS names of TLSCert): a
	// request whose Host or Origin header names another host is refused
	// (403), the defence against DNS rebinding. "*.example.com" admits one
	// label under example.com; "*" turns the check off. Default: none.
	AllowedHosts []string
	// MaxConnsPerSource caps the concurrent API connections of one source
	// IP address; a new connection over it is closed at once. The other
	// members' addresses are not capped. 0: 512; -1: no cap.
	MaxConnsPerSource int

	// Security (docs/security.md): see internal/guard/security.go.
	guard.Security
}

// TLS reports whether the configuration turns TLS on.
func (c *Config) TLS() bool { return c.TLSCert != "" || c.TLSKey != "" || c.TLSCA != "" }

// DefaultConfig returns the defaults of `lockd serve` with no flags.
func DefaultConfig() Config {
	return Config{
		DataDir:           "./lockd-data",
		Listen:            "127.0.0.1:7070",
		RaftListen:        "127.0.0.1:7071",
		HeartbeatTimeout:  400 * time.Millisecond,
		ElectionTimeout:   400 * time.Millisecond,
		DefaultTTL:        10 * time.Second,
		MinTTL:            time.Second,
		MaxTTL:            time.Hour,
		MaxPollTimeout:    30 * time.Second,
		ApplyTimeout:      10 * time.Second,
		SnapshotInterval:  2 * time.Minute,
		SnapshotThreshold: 8192,
		SnapshotLogBytes:  2 << 20,
		SnapshotRetain:    2,
		TrailingLogs:      10240,
		WALSegmentSize:    64 << 20,
		JoinTimeout:       time.Minute,
		WatchdogTimeout:   10 * time.Second,
		WatchHistory:      16384,
		WatchBuffer:       256,
		MaxConnsPerSource: guard.DefaultMaxConnsPerSource,
	}
}

// Validate reports every problem in c, or nil. It sets Grace to
// ElectionTimeout when left zero, and WatchHistory and WatchBuffer to their
// defaults; the advertise addresses stay as given
// (New derives the API URL from the listener, RaftAdvertise falls back to
// RaftListen).
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.DataDir == "" {
		bad("data-dir must not be empty")
	}
	checkAddr := func(flag, addr, adv string) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			bad("%s %q: %v", flag, addr, err)
			return
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			bad("%s %q: port must be a number from 0 to 65535", flag, addr)
		}
		if ip := net.ParseIP(host); (host == "" || ip != nil && ip.IsUnspecified()) && adv == "" {
			bad("%s %q is a wildcard address: give an advertise address too", flag, addr)
		}
	}
	checkAddr("listen", c.Listen, c.Advertise)
	checkAddr("raft-listen", c.RaftListen, c.RaftAdvertise)
	if c.Grace == 0 {
		c.Grace = c.ElectionTimeout
	}
	positive := map[string]time.Duration{
		"heartbeat-timeout": c.HeartbeatTimeout, "election-timeout": c.ElectionTimeout,
		"default-ttl": c.DefaultTTL, "min-ttl": c.MinTTL, "max-ttl": c.MaxTTL,
		"max-poll-timeout": c.MaxPollTimeout, "apply-timeout": c.ApplyTimeout,
		"snapshot-interval": c.SnapshotInterval, "grace": c.Grace, "watchdog-timeout": c.WatchdogTimeout,
	}
	for _, name := range []string{"heartbeat-timeout", "election-timeout", "grace", "default-ttl", "min-ttl", "max-ttl", "max-poll-timeout", "apply-timeout", "snapshot-interval", "watchdog-timeout"} {
		if positive[name] <= 0 {
			bad("%s must be positive, got %v", name, positive[name])
		}
	}
	if c.HeartbeatTimeout > 0 && c.HeartbeatTimeout < 5*time.Millisecond {
		bad("heartbeat-timeout %v is below 5ms", c.HeartbeatTimeout)
	}
	if c.MinTTL > c.MaxTTL {
		bad("min-ttl %v is above max-ttl %v", c.MinTTL, c.MaxTTL)
	}
	if c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL {
		bad("default-ttl %v is outside [min-ttl %v, max-ttl %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	}
	if c.SnapshotThreshold == 0 {
		bad("snapshot-threshold must be positive")
	}
	if c.WALSegmentSize < 4096 {
		bad("wal-segment-size %d is below 4096 bytes", c.WALSegmentSize)
	}
	if c.SnapshotRetain < 1 {
		bad("snapshot-retain must be at least 1")
	}
	if len(c.Join) > 0 {
		if _, port, err := net.SplitHostPort(RaftAdvertise(*c)); err == nil && port == "0" {
			bad("a joining node needs a fixed Raft port (--raft-listen or --raft-advertise with a port other than 0)")
		}
	}
	if c.Restore != "" && len(c.Join) > 0 {
		bad("--restore bootstraps a new cluster: it excludes --join")
	}
	// Zero means the default, so a Config built by hand keeps working.
	if c.WatchHistory == 0 {
		c.WatchHistory = DefaultConfig().WatchHistory
	}
	if c.WatchBuffer == 0 {
		c.WatchBuffer = DefaultConfig().WatchBuffer
	}
	if c.WatchHistory < 1 || c.WatchBuffer < 1 {
		bad("watch-history and watch-buffer must be at least 1")
	}
	if c.JoinTimeout <= 0 {
		bad("join-timeout must be positive")
	}
	if len(c.NodeID) > 64 {
		bad("node-id is longer than 64 bytes")
	}
	for _, h := range c.AllowedHosts {
		if !guard.ValidAllowedHost(h) {
			bad("allowed-hosts %q: want a host name (no scheme or path), *.domain, or * alone", h)
		}
	}
	if c.MaxConnsPerSource < -1 {
		bad("max-conns-per-source %d: want a cap, 0 for the default or -1 for none", c.MaxConnsPerSource)
	}
	if c.MaxStreamsPerIdentity < -1 {
		bad("max-streams-per-identity %d: want a cap, 0 for the default or -1 for none", c.MaxStreamsPerIdentity)
	}
	errs = append(errs, c.validateTLS()...)
	return errors.Join(errs...)
}

// RaftAdvertise is the Raft address peers use to reach this node.
func RaftAdvertise(cfg Config) string {
	if cfg.RaftAdvertise != "" {
		return cfg.RaftAdvertise
	}
	return cfg.RaftListen
}
