package node

import (
	"errors"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/wallclock"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// This file holds the metrics that answer an operator's questions about
// locks (are acquisitions slow, do sessions expire while holding) and about
// Raft (commits, leader changes, snapshots). They are observed on the node
// that serves the call or runs the timer, the leader, so a cluster-wide sum
// counts each event once. Labels take a handful of fixed values: never a
// lock name or a session id. The watch stream's metrics (streams, resets)
// and limit hits by reason belong with those features, not here.

// Acquire outcomes: the values of the outcome label.
const (
	outcomeGranted     = "granted"
	outcomeBusy        = "busy"
	outcomeTimeout     = "timeout"
	outcomeCancelled   = "cancelled"
	outcomeAlreadyDone = "already_done"
	outcomeError       = "error"
)

var acquireOutcomes = []string{outcomeGranted, outcomeBusy, outcomeTimeout, outcomeCancelled, outcomeAlreadyDone, outcomeError}

// Ends of a hold: the values of the end label.
const (
	EndReleased  = "released"
	EndCompleted = "completed"
	endExpired   = "expired"
)

// LockMetrics are the lock and Raft metrics of this file.
type LockMetrics struct {
	acquire         *prometheus.HistogramVec
	wait            *prometheus.HistogramVec
	hold            *prometheus.HistogramVec
	expiredHolding  prometheus.Counter
	holdsExpired    prometheus.Counter
	holdsRevoked    prometheus.Counter
	DelayHits       prometheus.Counter
	MarksSet        prometheus.Counter
	marksExpired    prometheus.Counter
	leaderChanges   prometheus.Counter
	snapshotSeconds prometheus.Histogram
	snapshotBytes   prometheus.Gauge
}

// latencyBuckets span 100 µs to about 55 s: a grant on a free lock takes
// one commit (milliseconds), a wait can last a poll timeout or longer.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 15)

// holdBuckets span 1 ms to about 2.6 h.
var holdBuckets = prometheus.ExponentialBuckets(0.001, 3, 16)

// NewLockMetrics registers the lock and Raft metrics in reg.
func NewLockMetrics(reg prometheus.Registerer) *LockMetrics {
	m := &LockMetrics{
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lockd_lock_acquire_duration_seconds", Help: "Time an Acquire call took on the leader, by outcome (granted, busy, timeout: still queued at the call's poll timeout or deadline, cancelled, already_done, error).",
			Buckets: latencyBuckets,
		}, []string{"outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lockd_lock_wait_duration_seconds", Help: "For Acquire calls that found their request queued: time from the first queueing of the request to the end of the call, by outcome.",
			Buckets: latencyBuckets,
		}, []string{"outcome"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lockd_lock_hold_duration_seconds", Help: "Time from a grant to the end of the hold, by how it ended (released, completed, expired).",
			Buckets: holdBuckets,
		}, []string{"end"}),
		expiredHolding: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_session_expired_holding_total", Help: "Sessions expired by this node as leader while they held at least one lock (the expiration alarm).",
		}),
		holdsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_lock_holds_expired_total", Help: "Holds ended by the expiry of their session.",
		}),
		holdsRevoked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_lock_holds_revoked_total", Help: "Holds whose revoke grace ran out on this node as leader: their session was revoked (it expires at its deadline, as after a force-release).",
		}),
		DelayHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_lock_delay_hits_total", Help: "Acquire calls refused or queued while the lock's lock-delay ran.",
		}),
		MarksSet: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_lock_marks_set_total", Help: "Completion marks set (Complete calls served).",
		}),
		marksExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_lock_marks_expired_total", Help: "Completion marks cleared by this node as leader when their retention ended.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockd_raft_leader_changes_total", Help: "Leader changes this node observed (a new leader, or none).",
		}),
		snapshotSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lockd_raft_snapshot_duration_seconds", Help: "Time to write a snapshot of the state, from its start to its close.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
		}),
		snapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockd_raft_snapshot_size_bytes", Help: "Size of the last snapshot this node wrote.",
		}),
	}
	// Every outcome and end exists from the start, so a rate over a series
	// that has not happened yet is 0, not absent.
	for _, o := range acquireOutcomes {
		m.acquire.WithLabelValues(o)
		if o != outcomeBusy {
			m.wait.WithLabelValues(o)
		}
	}
	for _, e := range []string{EndReleased, EndCompleted, endExpired} {
		m.hold.WithLabelValues(e)
	}
	reg.MustRegister(m.acquire, m.wait, m.hold, m.expiredHolding, m.holdsExpired, m.holdsRevoked, m.DelayHits, m.MarksSet, m.marksExpired, m.leaderChanges, m.snapshotSeconds, m.snapshotBytes)
	return m
}

// Acquired observes one Acquire call served here: its latency, and its
// wait when the request was queued (queuedAt not zero).
func (m *LockMetrics) Acquired(start, queuedAt time.Time, resp *connect.Response[lockdv1.AcquireResponse], err error) {
	o := acquireOutcome(resp, err)
	end := time.Now()
	m.acquire.WithLabelValues(o).Observe(end.Sub(start).Seconds())
	if !queuedAt.IsZero() && o != outcomeBusy {
		// queuedAt is the lock table's wall time: compared with wall time.
		m.wait.WithLabelValues(o).Observe(max(0, wallclock.Now().Sub(queuedAt).Seconds()))
	}
}

// acquireOutcome classifies an Acquire answer.
func acquireOutcome(resp *connect.Response[lockdv1.AcquireResponse], err error) string {
	if err == nil {
		if resp != nil && resp.Msg.Status == lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED {
			return outcomeGranted
		}
		return outcomeTimeout // QUEUED at the poll timeout
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return outcomeError
	}
	switch ce.Code() {
	case connect.CodeCanceled:
		return outcomeCancelled
	case connect.CodeDeadlineExceeded:
		return outcomeTimeout
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if ed, ok := v.(*lockdv1.ErrorDetail); ok {
			switch ed.Reason {
			case lockdv1.ErrorReason_ERROR_REASON_BUSY:
				return outcomeBusy
			case lockdv1.ErrorReason_ERROR_REASON_ALREADY_DONE:
				return outcomeAlreadyDone
			case lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED:
				return outcomeCancelled
			}
		}
	}
	return outcomeError
}

// HoldEnded observes a hold granted at granted that ended now.
func (m *LockMetrics) HoldEnded(end string, granted time.Time) {
	m.hold.WithLabelValues(end).Observe(max(0, wallclock.Now().Sub(granted).Seconds()))
}

// countLeaderChanges counts the leader changes Raft reports until done
// closes, and calls changed on each.
func (m *LockMetrics) countLeaderChanges(r *raft.Raft, done <-chan struct{}, changed func()) {
	ch := make(chan raft.Observation, 16)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(obs)
	defer r.DeregisterObserver(obs)
	for {
		select {
		case <-done:
			return
		case <-ch:
			m.leaderChanges.Inc()
			changed()
		}
	}
}

// timedSink measures one snapshot: its duration and its size.
type timedSink struct {
	raft.SnapshotSink
	m     *LockMetrics
	start time.Time
	n     int64
}

// Write counts the bytes written.
func (t *timedSink) Write(p []byte) (int, error) {
	n, err := t.SnapshotSink.Write(p)
	t.n += int64(n)
	return n, err
}

// Close observes the snapshot once it is stored.
func (t *timedSink) Close() error {
	err := t.SnapshotSink.Close()
	if err == nil {
		t.m.snapshotSeconds.Observe(time.Since(t.start).Seconds())
		t.m.snapshotBytes.Set(float64(t.n))
	}
	return err
}
