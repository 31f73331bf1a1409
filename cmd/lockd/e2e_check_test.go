package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"

	"github.com/lockd-dev/lockd/lockdtest"
)

// TestCheckAfterLeaderKill: on a three-node
// cluster of real `lockd serve` processes, `lockd check` (the binary) run
// right after kill -9 of the leader tells the current holder's token (exit
// 0) from the previous holder's (exit 1).
func TestCheckAfterLeaderKill(t *testing.T) {
	c := startCluster(t, 3)
	all := c.endpoints(0, 1, 2)
	cl, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(strings.Split(all, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	ctx := t.Context()
	a, err := cl.NewSession(ctx, lockd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := cl.NewSession(ctx, lockd.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := a.NewMutex("fence/stock"), b.NewMutex("fence/stock")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	stale := strconv.FormatUint(ma.Token(), 10)
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mb.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	current := strconv.FormatUint(mb.Token(), 10)

	leader := c.waitStable(t, c.nodes, 10*time.Second)
	var rest []int
	for i, n := range c.nodes {
		if n.id == leader {
			n.kill(t)
		} else {
			rest = append(rest, i)
		}
	}
	killed := time.Now()
	eps := c.endpoints(rest...)
	if out, errOut, code := lockdCLI(t, eps, "check", "--timeout", "20s", "fence/stock", current); code != 0 || !strings.Contains(out, "is current") {
		t.Fatalf("check of B's token right after the leader's kill: exit %d, %q %q; want 0", code, out, errOut)
	}
	t.Logf("current token confirmed %v after kill -9 of the leader", time.Since(killed).Round(time.Millisecond))
	if out, errOut, code := lockdCLI(t, eps, "check", "--timeout", "20s", "fence/stock", stale); code != 1 || !strings.Contains(out, "is stale") {
		t.Fatalf("check of A's token after the failover: exit %d, %q %q; want 1", code, out, errOut)
	}
	if ok, err := mb.CheckToken(ctx); !ok || err != nil {
		t.Errorf("B's Mutex.CheckToken after the failover: %v, %v", ok, err)
	}
}
