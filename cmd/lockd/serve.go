package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/server"
)

// ServeCommand is `lockd serve`: run a lockd node.
type ServeCommand struct {
	// Stderr receives the server's log and errors; nil means os.Stderr.
	Stderr io.Writer
}

// Run parses the flags, starts the node and serves until ctx ends (SIGINT
// or SIGTERM), then shuts down cleanly.
func (c *ServeCommand) Run(ctx context.Context, args []string) error {
	stderr := c.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("lockd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the Raft log, snapshots and node id")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "API address (Connect, JSON, /metrics, /healthz, /readyz)")
	fs.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "Raft transport address")
	fs.StringVar(&cfg.Advertise, "advertise", "", "API URL others use to reach this node (default: from --listen; required for a wildcard --listen)")
	fs.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "Raft address peers use (default: --raft-listen; required for a wildcard --raft-listen)")
	fs.StringVar(&cfg.NodeID, "node-id", "", "node id, persisted in the data dir on first start (default: random)")
	fs.Func("join", "comma-separated API URLs of cluster members to join (a node with existing data ignores it)", func(v string) error {
		for _, u := range strings.Split(v, ",") {
			if u = strings.TrimSpace(u); u != "" {
				cfg.Join = append(cfg.Join, u)
			}
		}
		if len(cfg.Join) == 0 {
			return errors.New("want at least one URL")
		}
		return nil
	})
	fs.StringVar(&cfg.AuthFile, "auth-file", "", "turn authentication on: tokens, identities, grants and limits (docs/security.md); default: off")
	fs.StringVar(&cfg.PeerTokenFile, "peer-token-file", "", "this node's own token (an identity with the peer grant), for forwarding and joining with --auth-file")
	fs.StringVar(&cfg.AuditLog, "audit-log", "", "append one JSON line per admin operation and refused call to this file (- for stdout; limit refusals aggregated per second)")
	fs.Float64Var(&cfg.RateLimit, "rate-limit", 0, "requests per second per identity, token bucket (default 10000 with --auth-file; without it, 0 = none, else per client IP)")
	fs.IntVar(&cfg.RateBurst, "rate-burst", 0, "token bucket size (default: twice --rate-limit)")
	fs.IntVar(&cfg.MaxSessionsPerIdentity, "max-sessions-per-identity", 0, "live sessions per identity, with --auth-file (default 10000)")
	fs.IntVar(&cfg.MaxWaitsPerIdentity, "max-waits-per-identity", 0, "queued Acquire calls in flight per identity, with --auth-file (default 10000)")
	fs.BoolVar(&cfg.ExactSessionCaps, "exact-session-caps", false, "enforce per-identity session caps exactly, in the replicated state machine; only once every node runs this version or later")
	fs.IntVar(&cfg.MaxStreamsPerIdentity, "max-streams-per-identity", 0, "open session and watch streams per identity on this node (per client IP for callers without credentials); 0: 64 with --auth-file, no cap without; -1: no cap")
	fs.StringVar(&cfg.Restore, "restore", "", "bootstrap a new cluster from this backup (lockd snapshot save); needs an empty data dir")
	fs.DurationVar(&cfg.JoinTimeout, "join-timeout", cfg.JoinTimeout, "give up joining after this long")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "Raft follower timeout before an election")
	fs.DurationVar(&cfg.ElectionTimeout, "election-timeout", cfg.ElectionTimeout, "Raft candidate election timeout")
	fs.DurationVar(&cfg.Grace, "grace", 0, "lease grace added to every session deadline on the leader (default: --election-timeout)")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "session TTL when a client asks none")
	fs.DurationVar(&cfg.MinTTL, "min-ttl", cfg.MinTTL, "smallest session TTL accepted")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "largest session TTL accepted")
	fs.DurationVar(&cfg.MaxPollTimeout, "max-poll-timeout", cfg.MaxPollTimeout, "longest one queued Acquire call blocks before answering QUEUED")
	fs.DurationVar(&cfg.ApplyTimeout, "apply-timeout", cfg.ApplyTimeout, "bound on one Raft proposal")
	fs.DurationVar(&cfg.WatchdogTimeout, "watchdog-timeout", cfg.WatchdogTimeout, "a leader whose proposals wait this long exits so another node can lead (hung disk)")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "how often Raft checks whether to snapshot")
	fs.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", cfg.SnapshotThreshold, "log entries since the last snapshot that trigger a new one")
	fs.Uint64Var(&cfg.SnapshotLogBytes, "snapshot-log-bytes", cfg.SnapshotLogBytes, "bytes written to the Raft log since the last snapshot that trigger a new one at once (at least an eighth of the last snapshot's size), bounding what a restart replays (0: off)")
	fs.Uint64Var(&cfg.TrailingLogs, "trailing-logs", cfg.TrailingLogs, "log entries kept after a snapshot for followers that are slightly behind")
	fs.IntVar(&cfg.WALSegmentSize, "wal-segment-size", cfg.WALSegmentSize, "bytes per Raft log segment file (the log is truncated by whole segments)")
	fs.IntVar(&cfg.SnapshotRetain, "snapshot-retain", cfg.SnapshotRetain, "snapshots kept on disk")
	fs.IntVar(&cfg.WatchHistory, "watch-history", cfg.WatchHistory, "recent lock events kept in memory for watchers to resume from (older positions get a reset)")
	fs.IntVar(&cfg.WatchBuffer, "watch-buffer", cfg.WatchBuffer, "events one watch stream copies from the history at a time")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "this node's certificate (PEM); with --tls-key and --tls-ca turns on TLS for the API, Raft, forwarding and joins (peers: mutual TLS)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "--tls-cert's private key (PEM)")
	fs.StringVar(&cfg.TLSCA, "tls-ca", "", "cluster CA (PEM): peers' certificates must chain to it, and clients' unless --tls-client-ca")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "CA of client certificates when not --tls-ca (never makes a client a peer)")
	fs.StringVar(&cfg.TLSClientAuth, "tls-client-auth", "none", "client certificates: none, verify-if-given or require")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "allow a non-loopback --listen or --raft-listen without TLS (logs a warning)")
	fs.Func("allowed-hosts", "comma-separated host names the API and pprof answer besides IP literals, localhost, the --listen/--advertise/--raft-advertise hosts and the TLS certificate's names (DNS rebinding guard; *.domain for one label under it; * turns the check off)", func(v string) error {
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h != "" {
				cfg.AllowedHosts = append(cfg.AllowedHosts, h)
			}
		}
		return nil
	})
	fs.IntVar(&cfg.MaxConnsPerSource, "max-conns-per-source", cfg.MaxConnsPerSource, "concurrent API connections per source IP address; a new one over it is closed at once (other members are not capped; -1: no cap)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	headroom := fs.Int("heap-headroom-mib", 128, "least room, in MiB, the Go heap may grow past what is live before it is collected (at least a quarter of the live heap); 0: off, Go's default (twice the live heap); off too when GOGC or GOMEMLIMIT is set in the environment, which then rule")
	pprofListen := fs.String("pprof-listen", "", "serve Go's profiler (/debug/pprof/) on this loopback address, apart from the API (default: off)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("serve takes no arguments, got %q", fs.Args())}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", *logLevel)}
	}
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch strings.ToLower(*logFormat) {
	case "text":
		h = slog.NewTextHandler(stderr, hopts)
	case "json":
		h = slog.NewJSONHandler(stderr, hopts)
	default:
		return usageError{fmt.Errorf("--log-format %q: want text or json", *logFormat)}
	}
	logger := slog.New(h)
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	if *pprofListen != "" {
		if err := checkPprofAddr(*pprofListen); err != nil {
			return usageError{err}
		}
	}
	if *headroom < 0 || *headroom > 1<<20 {
		return usageError{fmt.Errorf("--heap-headroom-mib %d: want 0 (off) to 1048576 (1 TiB)", *headroom)}
	}
	reg := prometheus.NewRegistry()
	srv, err := server.New(cfg, server.WithLogger(logger), server.WithRegistry(reg), server.WithVersion(version))
	if err != nil {
		return err
	}
	// After New, which restores the state: a restore builds the whole
	// table at once and is faster under Go's default pacing.
	if stop := startHeapCap(*headroom, logger); stop != nil {
		defer stop()
	}
	if *pprofListen != "" {
		// After New: the profiler answers the node's names only, like the
		// API (the Host check knows them once the node listens).
		stop, err := startPprof(*pprofListen, srv.GuardHost, logger)
		if err != nil {
			_ = srv.Close()
			return usageError{err}
		}
		defer stop()
	}
	// SIGHUP reloads the certificates and the auth file now; a changed
	// file is also picked up by itself (at the next handshake, or within a
	// second for the auth file).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for ctx.Err() == nil {
		select {
		case <-hup:
			if err := srv.ReloadTLS(); err != nil {
				logger.Error("sighup: tls certificates not reloaded", "err", err)
			}
			if err := srv.ReloadAuth(); err != nil {
				logger.Error("sighup: auth file not reloaded, the previous rules stay", "err", err)
			}
		case <-ctx.Done():
		}
	}
	logger.Info("shutting down")
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("shutdown did not finish in 30s")
	}
}
