package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"

	"connectrpc.com/connect"
	"github.com/lockd-dev/lockd/internal/node"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the node's Prometheus metrics. No label is unbounded: lock
// names never become labels.
type metrics struct {
	requests      *prometheus.CounterVec
	keepAlives    prometheus.Counter
	forwarded     prometheus.Counter
	streamsOpen   prometheus.Gauge
	streamFrames  *prometheus.CounterVec
	streamFrameOf []prometheus.Counter // streamFrames by kind index (streamKinds), resolved once
	watchStreams  prometheus.Gauge
	noticesSent   prometheus.Counter
	watchResets   prometheus.Counter
	lock          *node.LockMetrics // internal/node, metrics_lock.go
	limitHits     *prometheus.CounterVec
	authReloads   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, g prometheus.Gatherer, lock *node.LockMetrics) *metrics {
	m := &metrics{
		lock: lock,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockd_api_requests_total", Help: "API requests by method and Connect code.",
		}, []string{"method", "code"}),
		keepAlives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_session_keepalives_total", Help: "KeepAlives confirmed by this node as leader.",
		}),
	}
	m.forwarded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockd_api_forwarded_total", Help: "Requests this node forwarded to the leader.",
	})
	m.streamsOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockd_api_streams_open", Help: "Session streams open on this node.",
	})
	m.streamFrames = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_api_stream_frames_total", Help: "Calls received on session streams, by kind (a keep_alive frame is a batch).",
	}, []string{"kind"})
	for _, k := range streamKinds {
		m.streamFrameOf = append(m.streamFrameOf, m.streamFrames.WithLabelValues(k))
	}
	m.noticesSent = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockd_api_notices_sent_total", Help: "Release-request notices written to session streams (ReleaseRequested frames).",
	})
	m.watchStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockd_watch_streams_open", Help: "Watch streams (Connect and SSE) open on this node.",
	})
	m.watchResets = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockd_watch_resets_total", Help: "Resets sent to watch streams (position older than the history, restore, or a consumer too slow).",
	})
	m.limitHits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_limit_hits_total", Help: "Calls refused by a per-identity limit, by reason (rate, sessions, waits, streams; conns: connections over --max-conns-per-source).",
	}, []string{"reason"})
	for _, r := range []string{"sessions", "waits", "streams", "conns"} {
		m.limitHits.WithLabelValues(r)
	}
	m.authReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_auth_reloads_total", Help: "Reads of the auth file after start (SIGHUP or a change on disk), by outcome (ok; error: the previous rules stay).",
	}, []string{"outcome"})
	for _, o := range []string{"ok", "error"} {
		m.authReloads.WithLabelValues(o)
	}
	reg.MustRegister(m.requests, m.keepAlives, m.forwarded, m.streamsOpen, m.streamFrames, m.noticesSent, m.watchStreams, m.watchResets, m.limitHits, m.authReloads)
	if g != nil {
		// A private registry gets the process and Go collectors too.
		if r, ok := reg.(*prometheus.Registry); ok {
			r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		}
	}
	return m
}

// registerState exports gauges and counters read from the FSM and Raft.
func (m *metrics) registerState(reg prometheus.Registerer, s *Server) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_sessions", Help: "Live sessions."},
			func() float64 { return float64(s.fsm.Info().Sessions) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_locks", Help: "Locks with holders or waiters."},
			func() float64 { return float64(s.fsm.Info().Locks) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lockd_lock_grants_total", Help: "Grants applied by the state machine."},
			func() float64 { return float64(s.fsm.Info().Stats.Grants) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lockd_lock_queue_grants_total", Help: "Grants to queued waiters applied by the state machine."},
			func() float64 { return float64(s.fsm.Info().Stats.QueueGrants) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_raft_leader", Help: "1 when this node is the established leader."},
			func() float64 {
				if s.Ready() {
					return 1
				}
				return 0
			}),
	)
}

// interceptor counts every request the Connect handlers decoded, by
// procedure and code; countRefused counts the others.
func (m *metrics) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if c, ok := ctx.Value(countedKey{}).(*atomic.Bool); ok {
				c.Store(true)
			}
			resp, err := next(ctx, req)
			code := "ok"
			var ce *connect.Error
			if errors.As(err, &ce) {
				code = ce.Code().String()
			} else if err != nil {
				code = connect.CodeOf(err).String()
			}
			m.requests.WithLabelValues(req.Spec().Procedure, code).Inc()
			return resp, err
		}
	})
}

// countedKey marks, in a request's context, whether the interceptor counted
// the request.
type countedKey struct{}

// countRefused wraps the Connect handlers so that the requests Connect
// refuses before the interceptors run (malformed or oversized bodies, an
// unknown content type or method) are counted too, with the code of the
// error they got. The procedure label is one of procs (else "unknown"):
// a client cannot add label values.
func (m *metrics) countRefused(procs map[string]bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		counted := new(atomic.Bool)
		rec := &codeRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), countedKey{}, counted)))
		if counted.Load() {
			return
		}
		proc := r.URL.Path
		if !procs[proc] {
			proc = "unknown"
		}
		m.requests.WithLabelValues(proc, rec.code()).Inc()
	})
}

// codeRecorder notes the HTTP status, the start of an error body and the
// gRPC status of a response, to tell its Connect code.
type codeRecorder struct {
	http.ResponseWriter
	status int
	body   []byte
}

// WriteHeader notes the status.
func (c *codeRecorder) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
	c.ResponseWriter.WriteHeader(status)
}

// Write notes the start of an error body.
func (c *codeRecorder) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.status != http.StatusOK && len(c.body) < 4096 {
		c.body = append(c.body, b[:min(len(b), 4096-len(c.body))]...)
	}
	return c.ResponseWriter.Write(b)
}

// Flush passes flushes on (the gRPC protocols flush).
func (c *codeRecorder) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (c *codeRecorder) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// code is the Connect code of the recorded response: the gRPC status (gRPC
// and gRPC-Web), the code of a Connect error body, or one derived from the
// HTTP status.
func (c *codeRecorder) code() string {
	h := c.Header()
	for _, k := range []string{"Grpc-Status", http.TrailerPrefix + "Grpc-Status"} {
		if v := h.Get(k); v != "" {
			if n, err := strconv.Atoi(v); err == nil {
				if n == 0 {
					return "ok"
				}
				return connect.Code(n).String()
			}
		}
	}
	if c.status == 0 || c.status == http.StatusOK {
		return "ok"
	}
	var e struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(c.body, &e) == nil && e.Code != "" {
		var code connect.Code
		if code.UnmarshalText([]byte(e.Code)) == nil {
			return code.String()
		}
	}
	switch c.status {
	case http.StatusRequestEntityTooLarge:
		return connect.CodeResourceExhausted.String()
	case http.StatusUnsupportedMediaType, http.StatusMethodNotAllowed, http.StatusNotFound:
		return connect.CodeUnimplemented.String()
	}
	return connect.CodeUnknown.String()
}
