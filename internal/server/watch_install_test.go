package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
)

// A follower that lagged behind a compacted log catches up by a snapshot
// install, and no write comes after it: its watchers get their reset at
// once, not at the next write (which on an idle cluster may never come).
func TestWatchResetAfterSnapshotInstallWhenIdle(t *testing.T) {
	opts := defaultClusterOpts()
	opts.trailing = 4
	c := newTestCluster(t, 3, opts)
	l, err := c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := (l + 1) % 3
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	writer := c.newClient("writer")
	watcher := c.newClient("watcher")
	c.restrictClient("watcher", []int{f})

	type item struct {
		ev  lockd.Event
		err error
	}
	got := make(chan item, 1024)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for ev, err := range watcher.Watch(wctx, "i/", lockd.WatchState()) {
			select {
			case got <- item{ev, err}:
			case <-wctx.Done():
				return
			}
		}
	}()
	next := func(what string) item {
		t.Helper()
		select {
		case it := <-got:
			return it
		case <-time.After(15 * time.Second):
			t.Fatalf("%s: no event from the follower's watch after 15s", what)
			return item{}
		}
	}
	if it := next("at the start"); it.err != nil || it.ev.Kind != lockd.EventSynced {
		t.Fatalf("first event %v %v, want synced", it.ev.Kind, it.err)
	}
	tokens := churn(t, ctx, writer, "i/a", 1)
	if it := next("before the partition"); it.err != nil || it.ev.Kind != lockd.EventGranted || it.ev.Token != tokens[0] {
		t.Fatalf("first event %v %v, want granted %d", it.ev.Kind, it.err, tokens[0])
	}
	next("before the partition") // released

	// The follower misses entries that the leader then compacts away.
	c.partition([]int{f})
	l, err = c.waitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	churn(t, ctx, writer, "i/b", 20)
	leader := c.server(l)
	for i := range 3 { // both, so whichever leads after the heal has no log to send
		if i != f {
			for deadline := time.Now().Add(15 * time.Second); c.server(i).raft.AppliedIndex() < leader.raft.AppliedIndex(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("n%d did not catch up", i+1)
				}
			}
			if err := c.server(i).raft.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if first, _ := leader.nd.Hooks().WAL().FirstIndex(); first <= c.server(f).raft.AppliedIndex()+1 {
		t.Fatalf("leader's log starts at %d, the follower applied %d: no install needed", first, c.server(f).raft.AppliedIndex())
	}
	target := leader.raft.AppliedIndex()
	c.partition() // one group again; the watcher still reaches only f
	for deadline := time.Now().Add(15 * time.Second); c.server(f).raft.AppliedIndex() < target; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("follower at %d, leader at %d after 15s", c.server(f).raft.AppliedIndex(), target)
		}
	}
	if snap := c.server(f).raft.Stats()["last_snapshot_index"]; snap == "0" {
		t.Fatalf("the follower caught up without a snapshot install: %v", c.server(f).raft.Stats())
	}
	// No write from here on.
	it := next("after the install")
	if it.ev.Kind != lockd.EventReset || !errors.Is(it.err, lockd.ErrWatchReset) {
		t.Fatalf("after the install: %v, %v; want a reset", it.ev.Kind, it.err)
	}
}
