package node

import "github.com/prometheus/client_golang/prometheus"

// metrics are the node's Raft-side Prometheus metrics (the API's are
// internal/server's). No label is unbounded: lock names never become labels.
type metrics struct {
	applyDuration   prometheus.Histogram
	sessionsExpired prometheus.Counter
	waitersWoken    prometheus.Counter
	watchdogTrips   prometheus.Counter
	lock            *LockMetrics // metrics_lock.go
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		applyDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lockd_raft_apply_duration_seconds", Help: "Time from proposing a command to its result on this node.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		sessionsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_session_expired_total", Help: "Sessions this node expired as leader.",
		}),
		waitersWoken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_lock_waiters_woken_total", Help: "Blocked Acquire calls woken by a grant or a drop of their own request.",
		}),
	}
	m.watchdogTrips = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockd_raft_watchdog_trips_total", Help: "Times the leader watchdog found a stalled proposal.",
	})
	m.lock = NewLockMetrics(reg)
	reg.MustRegister(m.applyDuration, m.sessionsExpired, m.waitersWoken, m.watchdogTrips)
	return m
}
