package api

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockd-dev/lockd/internal/codec"
	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/guard"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// This file is the node's HTTP side: the mux (Connect API, /metrics,
// health, backup download) and the HTTP server.

// maxRequestBytes bounds one request body.
const maxRequestBytes = 64 << 10

// ClusterIDHeader is set on every API response to the cluster's id.
const ClusterIDHeader = "Lockd-Cluster-Id"

// Handler returns the HTTP handler of the node: the Connect API (Connect,
// gRPC and gRPC-Web, with gRPC reflection and the standard gRPC health
// service, so grpcurl and load balancers need no proto files), /metrics,
// /healthz, /readyz, the backup download and the dashboard (/ui/).
func (s *Server) Handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	count := connect.WithInterceptors(s.metrics.interceptor(), s.guard.Interceptor())
	vt := connect.WithCodec(codec.Codec{}) // generated-code protobuf for lockd's own services
	procs := procedures()
	handle := func(path string, h http.Handler) { mux.Handle(path, s.metrics.countRefused(procs, h)) }
	handle(lockdv1connect.NewLockServiceHandler(lockService{&api{s}}, vt, connect.WithReadMaxBytes(maxRequestBytes), connect.WithCompressMinBytes(4096), count))
	// Stream answers are never compressed: most frames are small, and the
	// large ones, keepalive batch answers, cost more to gzip than all
	// the rest of their serving (17 % of the server's CPU with 100 000
	// sessions) to save a few KiB per client per round. A client may
	// still send gzip.
	streamPath, stream := lockdv1connect.NewSessionServiceHandler(&sessionAPI{&api{s}}, vt, connect.WithReadMaxBytes(maxRequestBytes), connect.WithCompressMinBytes(math.MaxInt32))
	// A stream may come as an HTTP/2 stream or on an upgraded HTTP/1.1
	// connection of its own (upgrade.go).
	handle(streamPath, UpgradeStreams(streamHandler(coalesceFlushes(stream)), &s.upgrades))
	handle(lockdv1connect.NewClusterServiceHandler(clusterAPI{s}, vt, connect.WithReadMaxBytes(maxRequestBytes), count))
	watchPath, watch := lockdv1connect.NewWatchServiceHandler(watchAPI{s}, vt, connect.WithReadMaxBytes(maxRequestBytes), connect.WithCompressMinBytes(4096))
	handle(watchPath, streamHandler(watch))
	mux.HandleFunc("GET /v1/watch", watchAPI{s}.serveWatchSSE)
	handle(grpchealth.NewHandler(healthChecker{s}, connect.WithReadMaxBytes(maxRequestBytes), count))
	reflector := grpcreflect.NewStaticReflector(lockdv1connect.LockServiceName, lockdv1connect.SessionServiceName, lockdv1connect.ClusterServiceName, lockdv1connect.WatchServiceName, grpchealth.HealthV1ServiceName)
	handle(grpcreflect.NewHandlerV1(reflector, connect.WithReadMaxBytes(maxRequestBytes)))
	handle(grpcreflect.NewHandlerV1Alpha(reflector, connect.WithReadMaxBytes(maxRequestBytes)))
	if g != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /v1/snapshot", backupRoute{s}.serveSnapshot)
	dashboard{s}.uiRoutes(mux)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		// The leader's version probe reads it, ready or not (node/version.go).
		w.Header().Set(node.ApplyVersionHeader, strconv.FormatUint(uint64(s.versions.ApplyVersion()), 10))
		if why := s.notReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	peers := s.requirePeer(mux)
	// The Host/Origin check first: a rebound page gets nothing, not even
	// the cluster id.
	return s.guard.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := s.fsm.ClusterID(); id != "" {
			w.Header().Set(ClusterIDHeader, id)
		}
		peers.ServeHTTP(w, r)
	}))
}

// procedures lists the RPC paths the node serves: the values of the
// procedure label of lockd_api_requests_total.
func procedures() map[string]bool {
	m := map[string]bool{}
	svcs := lockdv1.File_lockd_v1_lockd_proto.Services()
	for i := range svcs.Len() {
		sd := svcs.Get(i)
		for j := range sd.Methods().Len() {
			m["/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name())] = true
		}
	}
	for _, p := range []string{
		"/" + grpchealth.HealthV1ServiceName + "/Check",
		"/" + grpchealth.HealthV1ServiceName + "/Watch",
		"/" + grpcreflect.ReflectV1ServiceName + "/ServerReflectionInfo",
		"/" + grpcreflect.ReflectV1AlphaServiceName + "/ServerReflectionInfo",
	} {
		m[p] = true
	}
	return m
}

// healthChecker answers the gRPC health service like /readyz: SERVING when
// this node can serve clients (the established leader, or a follower that
// forwards to a known leader), for the whole server ("") and for each lockd
// service.
type healthChecker struct{ s *Server }

// Check implements grpchealth.Checker.
func (h healthChecker) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	switch req.Service {
	case "", lockdv1connect.LockServiceName, lockdv1connect.SessionServiceName, lockdv1connect.ClusterServiceName, lockdv1connect.WatchServiceName:
	default:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %q", req.Service))
	}
	if h.s.notReady() != "" {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

// notReady says why this node cannot serve clients now, or "" when it can:
// as the established leader, or as a follower that knows the leader's API
// and forwards to it.
func (s *Server) notReady() string {
	if s.Ready() {
		return ""
	}
	if s.cluster.State() == raft.Leader {
		return "leader not established yet"
	}
	if _, err := s.leaderURL(http.Header{}); err != nil {
		return "no leader known"
	}
	return ""
}

// Listener wraps the API listener (already capped per source by the
// assembly) in TLS when it is on, else in buffered reads (TLS reads whole
// records already).
func (s *Server) Listener(l net.Listener) net.Listener {
	ln := s.tlsListener(l)
	if s.tls == nil {
		ln = readBuffered(ln)
	}
	return ln
}

// backupRoute serves the backup download.
type backupRoute struct{ *Server }

// serveSnapshot writes a consistent backup of the state (the FSM snapshot
// format) after a linearizable read on the leader; a follower redirects to
// the leader.
func (s backupRoute) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	called := false
	err := s.guard.Run(r.Context(), guard.SnapshotRequest{}, "SnapshotSave", func(context.Context) error {
		called = true
		return s.snapshot(w, r)
	})
	if err != nil && !called {
		// Refused: the same status codes Connect uses for these codes.
		http.Error(w, err.Error(), connectHTTPStatus(connect.CodeOf(err)))
	}
}

func connectHTTPStatus(c connect.Code) int {
	switch c {
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	}
	return http.StatusServiceUnavailable
}

// snapshot serves serveSnapshot once allowed.
func (s backupRoute) snapshot(w http.ResponseWriter, r *http.Request) error {
	url, err := s.leaderURL(r.Header)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return err
	}
	if url != "" {
		http.Redirect(w, r, url+r.URL.Path, http.StatusTemporaryRedirect)
		return nil
	}
	if err := s.node.Linearizable(); err != nil {
		http.Error(w, s.errs.RaftError(err).Error(), http.StatusServiceUnavailable)
		return err
	}
	b, err := fsm.EncodeSnapshot(s.fsm.State())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, err = w.Write(b)
	return err
}
