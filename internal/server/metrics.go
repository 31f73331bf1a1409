package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the node's Prometheus metrics. No label is unbounded: lock
// names never become labels.
type metrics struct {
	applyDuration   prometheus.Histogram
	requests        *prometheus.CounterVec
	keepAlives      prometheus.Counter
	sessionsExpired prometheus.Counter
	waitersWoken    prometheus.Counter
	forwarded       prometheus.Counter
	watchdogTrips   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, g prometheus.Gatherer) *metrics {
	m := &metrics{
		applyDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lockd_raft_apply_duration_seconds", Help: "Time from proposing a command to its result on this node.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockd_api_requests_total", Help: "API requests by method and Connect code.",
		}, []string{"method", "code"}),
		keepAlives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_session_keepalives_total", Help: "KeepAlives confirmed by this node as leader.",
		}),
		sessionsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_session_expired_total", Help: "Sessions this node expired as leader.",
		}),
		waitersWoken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_lock_waiters_woken_total", Help: "Blocked Acquire calls woken by a grant or a drop of their own request.",
		}),
	}
	m.forwarded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockd_api_forwarded_total", Help: "Requests this node forwarded to the leader.",
	})
	m.watchdogTrips = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockd_raft_watchdog_trips_total", Help: "Times the leader watchdog found a stalled proposal.",
	})
	reg.MustRegister(m.applyDuration, m.requests, m.keepAlives, m.sessionsExpired, m.waitersWoken, m.forwarded, m.watchdogTrips)
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

func (m *metrics) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
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
