package server

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// `lockd release --force --unsafe-now` (ForceRelease with unsafe_now) ends
// the hold at once, and the watch calls it FORCE_RELEASED, not EXPIRED: an
// operator did it, no lease ran out.
func TestForceReleaseUnsafeNowEvent(t *testing.T) {
	c := newTestCluster(t, 1, defaultClusterOpts())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cl := c.newClient("f")
	s, err := cl.NewSession(ctx, lockd.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	m := s.NewMutex("f/x")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Service().ForceRelease(ctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: "f/x", UnsafeNow: true}))
	if err != nil || len(resp.Msg.SessionIds) != 1 {
		t.Fatalf("force release: %v, %v", resp, err)
	}
	evs := collect(t, ctx, cl, "f/", 2, lockd.WatchFrom("0.0"))
	if evs[0].Kind != lockd.EventGranted || evs[1].Kind != lockd.EventForceReleased || evs[1].Token != m.Token() {
		t.Fatalf("events %v %v (token %d), want granted, force-released (token %d)", evs[0].Kind, evs[1].Kind, evs[1].Token, m.Token())
	}
}
