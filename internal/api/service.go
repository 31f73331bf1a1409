package api

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/node"
)

// Deps is what the API layer is built from: the node as the handlers see
// it, its read views (node.Parts), and where the metrics go.
type Deps struct {
	Config     node.Config
	Log        *slog.Logger
	Version    string // reported by Status
	NodeID     string
	APIURL     string
	Node       Node
	Parts      node.Parts
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer // nil: no /metrics route
}

// Server is a node's API: the Connect handlers, the session stream, the
// watch, forwarding and the HTTP routes, over the node (Node, Cluster) and
// the FSM's read views. internal/server builds one with New, hands it the
// guard and the started node's Raft side with Start, and serves Handler.
type Server struct {
	cfg     node.Config
	log     *slog.Logger
	version string
	nodeID  string
	apiURL  string

	node    Node    // proposals, reads, leadership, membership
	cluster Cluster // Raft's own facts and membership changes; set by Start

	// What the API reads of the node, set once by New.
	fsm        *fsm.FSM
	lease      *lease.Manager
	waiters    *node.Waiters
	notices    *node.Notices // the streams that deliver release requests
	hub        *node.Hub     // the watch history
	tls        *certs.Store
	clientAuth certs.ClientAuth
	done       <-chan struct{} // closed when the node begins to stop
	fwd        *node.Forwarder // clients to other members' APIs; set by Start
	versions   node.Versions   // the version this node reports, the join check
	gatherer   prometheus.Gatherer

	metrics   *metrics
	errs      *Errors       // the error mapping
	keepalive time.Duration // watchKeepalive; shorter in tests

	guard *guard.Guard // authentication, authorization, limits, audit (internal/guard)

	upgrades Upgrades // the streams on upgraded connections (upgrade.go)
}

// New builds the API of a node that is open but not started yet, and
// registers its metrics.
func New(d Deps) *Server {
	p := d.Parts
	s := &Server{cfg: d.Config, log: d.Log, version: d.Version, nodeID: d.NodeID, apiURL: d.APIURL, node: d.Node,
		fsm: p.FSM, lease: p.Lease, waiters: p.Waiters, notices: p.Notices, hub: p.Hub, tls: p.TLS, clientAuth: p.ClientAuth, done: p.Done, versions: p.Versions,
		gatherer: d.Gatherer, keepalive: watchKeepalive}
	s.metrics = newMetrics(d.Registerer, d.Gatherer, p.LockMetrics)
	s.errs = NewErrors(d.Node, p.FSM, d.NodeID, s.metrics.limitHits)
	s.metrics.registerState(d.Registerer, s)
	return s
}

// Start hands the API the node's guard and, once the node has started,
// its Raft side and forwarder; call it before serving Handler.
func (s *Server) Start(g *guard.Guard, c Cluster, fwd *node.Forwarder) {
	s.guard, s.cluster, s.fwd = g, c, fwd
}

// CloseUpgraded waits for the streams served on upgraded connections,
// which the HTTP server's shutdown does not track, to end (they end once
// the node stops), and past ctx closes their connections.
func (s *Server) CloseUpgraded(ctx context.Context) { s.upgrades.Close(ctx) }

// Errors is the API's error mapping (the guard answers with it too).
func (s *Server) Errors() *Errors { return s.errs }

// LimitHits counts refusals by limit (lockd_limit_refusals_total), for the guard.
func (s *Server) LimitHits() *prometheus.CounterVec { return s.metrics.limitHits }

// AuthReloads counts auth file reloads by result, for the guard.
func (s *Server) AuthReloads() *prometheus.CounterVec { return s.metrics.authReloads }

// Ready reports whether this node is the established leader.
func (s *Server) Ready() bool { return s.node.Ready() }
