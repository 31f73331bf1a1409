package server

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lockd-dev/lockd"
)

// A client that knows only a follower: its stream to the follower carries
// its calls, which the follower forwards like unary ones; its keepalive
// batches are answered with the leader's URL, which the client follows,
// and the leader then renews them.
func TestStreamThroughFollower(t *testing.T) {
	if !streamOn() {
		t.Skip("LOCKD_STREAM=off: the harness's clients speak HTTP/1.1")
	}
	c := newTestCluster(t, 3, defaultClusterOpts())
	l, err := c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := (l + 1) % 3
	cl := c.newClient("via-follower", lockd.WithEndpoints(c.nodes[f].url))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, err := cl.NewSession(ctx, lockd.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m := s.NewMutex("follower")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := value(c.server(f).api.Hooks().StreamFrames().WithLabelValues("acquire")); n < 1 {
		t.Errorf("%v acquire frames on the follower's stream", n)
	}
	leader := c.server(l).api.Hooks()
	start := value(leader.KeepAlives())
	for value(leader.KeepAlives()) < start+3 {
		if ctx.Err() != nil {
			t.Fatal("the leader renewed no session of a client that knew only a follower")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := value(leader.StreamFrames().WithLabelValues("keep_alive")); n < 3 {
		t.Errorf("%v keepalive batches on the leader, want >= 3", n)
	}
	if s.Err() != nil {
		t.Fatalf("session: %v", s.Err())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
