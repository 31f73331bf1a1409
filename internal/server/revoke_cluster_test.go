package server

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestRequestReleaseSeenInWatch on a real 3-node cluster: a waiter asks the
// holder to let go; a watcher of the lock sees the request with the
// holder's session and token and the reason; the hold is unchanged.
func TestRequestReleaseSeenInWatch(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	upgraded(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := newMember(t, c, "holder", "deploy/web", 15*time.Second)
	if err := h.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	watcher := c.newClient("watcher")
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	seen := make(chan lockd.Event, 1)
	ready := make(chan struct{})
	go func() {
		defer close(seen)
		for ev, err := range watcher.Watch(wctx, "deploy/", lockd.WatchState()) {
			if err != nil {
				return
			}
			if ev.Kind == lockd.EventSynced {
				close(ready)
			}
			if ev.Kind == lockd.EventReleaseRequested {
				seen <- ev
				return
			}
		}
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatal("the watch did not sync")
	}
	w := c.newClient("waiter")
	resp, err := w.Service().RequestRelease(ctx, connect.NewRequest(&lockdv1.RequestReleaseRequest{Name: "deploy/web", Reason: "release 42 waits"}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.GetHolders() != 1 {
		t.Fatalf("holders asked: %d", resp.Msg.GetHolders())
	}
	var ev lockd.Event
	select {
	case ev = <-seen:
	case <-ctx.Done():
		t.Fatal("no release request in the watch")
	}
	if ev.Session != h.s.ID() || ev.Token != h.m.Token() || string(ev.Value) != "release 42 waits" {
		t.Fatalf("event %+v, want the holder's session %s, token %d and the reason", ev, h.s.ID(), h.m.Token())
	}
	if h.m.Err() != nil {
		t.Fatalf("the hold ended: %v", h.m.Err())
	}
}
