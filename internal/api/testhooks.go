package api

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// This file exports what the whole-node tests (internal/server, which runs
// nodes over HTTP) call or check inside the API. Nothing else calls it.

// TestHooks reaches the API's insides for the whole-node tests.
type TestHooks struct {
	s    *Server
	sess *sessionAPI // built once, so calls through it allocate nothing more
}

// Hooks returns the API's test hooks.
func (s *Server) Hooks() TestHooks { return TestHooks{s: s, sess: &sessionAPI{&api{s}}} }

// LockService is the LockService handler, called directly.
func (h TestHooks) LockService() lockdv1connect.LockServiceHandler { return lockService{h.sess.a} }

// KeepAliveBatch renews a batch as the session stream's batch handler does.
func (h TestHooks) KeepAliveBatch(ctx context.Context, b *lockdv1.KeepAliveBatch, received time.Time) (*lockdv1.KeepAliveBatchResponse, error) {
	return h.sess.keepAliveBatch(ctx, b, received)
}

// ServeFrame serves one session-stream frame as a stream worker does.
func (h TestHooks) ServeFrame(ctx context.Context, req *lockdv1.StreamRequest, received time.Time) *lockdv1.StreamResponse {
	return h.sess.serve(ctx, req, received)
}

// StreamEvents runs the watch loop Connect and SSE share.
func (h TestHooks) StreamEvents(ctx context.Context, prefix, from string, state bool, send func(*lockdv1.WatchResponse) error, idle func(cursor string) error) error {
	return watchAPI{h.s}.streamEvents(ctx, prefix, from, state, send, idle)
}

// ParseFrom reads a watch position as a WatchRequest's from.
func (h TestHooks) ParseFrom(from string) (cursor node.Pos, reset bool, err error) {
	return watchAPI{h.s}.parseFrom(from)
}

// Forwarded counts the calls this node forwarded to the leader.
func (h TestHooks) Forwarded() prometheus.Counter { return h.s.metrics.forwarded }

// KeepAlives counts the sessions renewed.
func (h TestHooks) KeepAlives() prometheus.Counter { return h.s.metrics.keepAlives }

// StreamFrames counts session-stream frames by kind.
func (h TestHooks) StreamFrames() *prometheus.CounterVec { return h.s.metrics.streamFrames }

// WatchStreams is the number of open watch streams.
func (h TestHooks) WatchStreams() prometheus.Gauge { return h.s.metrics.watchStreams }

// SetWatchKeepalive sets the watch's keepalive period of the API servers
// built from now on, and returns what restores it (call it in
// t.Cleanup; the tests that use it do not run in parallel).
func SetWatchKeepalive(d time.Duration) (restore func()) {
	old := watchKeepalive
	watchKeepalive = d
	return func() { watchKeepalive = old }
}
