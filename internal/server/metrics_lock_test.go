package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// scrape parses the server's /metrics.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// sample returns the value of a counter or gauge, or the sample count of a
// histogram, of family name with the one label given (label "" for none).
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name, label, value string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("metric %s not exported", name)
	}
	for _, m := range f.Metric {
		if label != "" && !hasLabel(m, label, value) {
			continue
		}
		switch {
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("metric %s{%s=%q} not exported", name, label, value)
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.Label {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// waitMetric polls /metrics until the sample equals want (the leader's
// timers act in real time here: real sockets cannot run in a synctest
// bubble).
func waitMetric(t *testing.T, url, name, label, value string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := sample(t, scrape(t, url), name, label, value)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s{%s=%q} = %v, want %v", name, label, value, got, want)
		}
		time.Sleep(20 * time.Millisecond) // polling a real server's /metrics
	}
}

// TestMetricsCountScriptedWorkload runs a workload whose every step is known
// (a grant, a busy refusal, a poll timeout, a wait granted after a release,
// a wait cancelled, a completion and an acquire of the completed lock, a
// session expired while holding, an acquire refused by the lock-delay)
// and checks that the counters and histogram counts on /metrics equal it.
func TestMetricsCountScriptedWorkload(t *testing.T) {
	srv := lockdtest.New(t)
	c := newRaw(t, srv)
	ctx := context.Background()
	a, b, cs, d := c.session(10*time.Second), c.session(10*time.Second), c.session(10*time.Second), c.session(10*time.Second)

	// granted #1: a holds x.
	ga, err := c.acquire(&lockdv1.AcquireRequest{SessionId: a, Seq: 1, Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	// busy #1.
	if _, err := c.acquire(&lockdv1.AcquireRequest{SessionId: b, Seq: 1, Name: "x"}); reason(err) != lockdv1.ErrorReason_ERROR_REASON_BUSY {
		t.Fatalf("try acquire of a held lock: %v, want busy", err)
	}
	// timeout #1 (wait timeout #1): b queues, its call ends at the poll
	// timeout, then b cancels the wait.
	r, err := c.acquire(&lockdv1.AcquireRequest{SessionId: b, Seq: 2, Name: "x", Wait: true, PollTimeout: durationpb.New(50 * time.Millisecond)})
	if err != nil || r.Status != lockdv1.AcquireStatus_ACQUIRE_STATUS_QUEUED {
		t.Fatalf("acquire with a short poll: %v %v, want queued", r, err)
	}
	if _, err := c.svc.Cancel(ctx, connect.NewRequest(&lockdv1.CancelRequest{SessionId: b, Seq: 3, Name: "x", AcquireSeq: 2})); err != nil {
		t.Fatal(err)
	}
	// granted #2 (wait granted #1), hold released #1: cs waits on x,
	// a releases.
	granted := make(chan *lockdv1.AcquireResponse, 1)
	go func() {
		r, err := c.acquire(&lockdv1.AcquireRequest{SessionId: cs, Seq: 1, Name: "x", Wait: true, PollTimeout: durationpb.New(10 * time.Second)})
		if err != nil {
			t.Errorf("wait on x: %v", err)
		}
		granted <- r
	}()
	waitQueue(t, c, "x", 1)
	if _, err := c.svc.Release(ctx, connect.NewRequest(&lockdv1.ReleaseRequest{SessionId: a, Seq: 2, Name: "x", Token: ga.Token})); err != nil {
		t.Fatal(err)
	}
	gc := <-granted
	if gc == nil || gc.Status != lockdv1.AcquireStatus_ACQUIRE_STATUS_GRANTED {
		t.Fatalf("waiter on x: %v, want granted", gc)
	}
	// hold completed #1, mark set #1, then already_done #1.
	if _, err := c.svc.Complete(ctx, connect.NewRequest(&lockdv1.CompleteRequest{SessionId: cs, Seq: 2, Name: "x", Token: gc.Token, Retention: durationpb.New(time.Second)})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.acquire(&lockdv1.AcquireRequest{SessionId: d, Seq: 1, Name: "x"}); reason(err) != lockdv1.ErrorReason_ERROR_REASON_ALREADY_DONE {
		t.Fatalf("acquire of a completed lock: %v, want already done", err)
	}
	// granted #3: d holds y; cancelled #1 (wait cancelled #1): b waits on
	// y and cancels its wait while its call blocks.
	if _, err := c.acquire(&lockdv1.AcquireRequest{SessionId: d, Seq: 2, Name: "y"}); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan error, 1)
	go func() {
		_, err := c.acquire(&lockdv1.AcquireRequest{SessionId: b, Seq: 4, Name: "y", Wait: true, PollTimeout: durationpb.New(10 * time.Second)})
		dropped <- err
	}()
	waitQueue(t, c, "y", 1)
	if _, err := c.svc.Cancel(ctx, connect.NewRequest(&lockdv1.CancelRequest{SessionId: b, Seq: 5, Name: "y", AcquireSeq: 4})); err != nil {
		t.Fatal(err)
	}
	if err := <-dropped; reason(err) != lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED {
		t.Fatalf("cancelled wait: %v, want wait dropped", err)
	}
	// granted #4, then session expired while holding #1 (hold expired #1):
	// a short session holds z, with a long lock-delay, and is never kept
	// alive.
	short := c.session(200 * time.Millisecond)
	if _, err := c.acquire(&lockdv1.AcquireRequest{SessionId: short, Seq: 1, Name: "z", LockDelay: durationpb.New(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, srv.URL(), "lockd_session_expired_holding_total", "", "", 1)
	// busy #2 and lock-delay hit #1: z is held back by its lock-delay.
	if _, err := c.acquire(&lockdv1.AcquireRequest{SessionId: d, Seq: 3, Name: "z"}); reason(err) != lockdv1.ErrorReason_ERROR_REASON_BUSY {
		t.Fatalf("acquire during the lock-delay: %v, want busy", err)
	}
	// The completion mark on x ends after its retention (1 s).
	waitMetric(t, srv.URL(), "lockd_lock_marks_expired_total", "", "", 1)

	fams := scrape(t, srv.URL())
	for _, w := range []struct {
		name, label, value string
		want               float64
	}{
		{"lockd_lock_acquire_duration_seconds", "outcome", "granted", 4},
		{"lockd_lock_acquire_duration_seconds", "outcome", "busy", 2},
		{"lockd_lock_acquire_duration_seconds", "outcome", "timeout", 1},
		{"lockd_lock_acquire_duration_seconds", "outcome", "cancelled", 1},
		{"lockd_lock_acquire_duration_seconds", "outcome", "already_done", 1},
		{"lockd_lock_acquire_duration_seconds", "outcome", "error", 0},
		{"lockd_lock_wait_duration_seconds", "outcome", "granted", 1},
		{"lockd_lock_wait_duration_seconds", "outcome", "timeout", 1},
		{"lockd_lock_wait_duration_seconds", "outcome", "cancelled", 1},
		{"lockd_lock_hold_duration_seconds", "end", "released", 1},
		{"lockd_lock_hold_duration_seconds", "end", "completed", 1},
		{"lockd_lock_hold_duration_seconds", "end", "expired", 1},
		{"lockd_session_expired_total", "", "", 1},
		{"lockd_session_expired_holding_total", "", "", 1},
		{"lockd_lock_holds_expired_total", "", "", 1},
		{"lockd_lock_delay_hits_total", "", "", 1},
		{"lockd_lock_marks_set_total", "", "", 1},
		{"lockd_lock_marks_expired_total", "", "", 1},
	} {
		if got := sample(t, fams, w.name, w.label, w.value); got != w.want {
			t.Errorf("%s{%s=%q} = %v, want %v", w.name, w.label, w.value, got, w.want)
		}
	}
	// One node that elected itself: at least one leader change seen.
	if got := sample(t, fams, "lockd_raft_leader_changes_total", "", ""); got < 1 {
		t.Errorf("lockd_raft_leader_changes_total = %v, want at least 1", got)
	}
	for _, name := range []string{"lockd_raft_apply_duration_seconds", "lockd_raft_snapshot_duration_seconds", "lockd_raft_snapshot_size_bytes"} {
		sample(t, fams, name, "", "")
	}
}

// waitQueue polls DescribeLock until the lock has n waiters.
func waitQueue(t *testing.T, c *rawClient, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l := describe(t, c, name); l != nil && len(l.Waiters) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %s: no %d waiters after 10s", name, n)
		}
		time.Sleep(5 * time.Millisecond) // polling a real server
	}
}
