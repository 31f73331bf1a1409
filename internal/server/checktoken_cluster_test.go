package server

import (
	"context"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
)

// TestCheckTokenAcrossFailover: Client.CheckToken
// tells a current token from a stale one right after a failover.
//
//  1. The leader crashes while A holds: as soon as a new leader is
//     established, A's token is still current and a wrong one is not.
//  2. A hands over to B; B's token is current, A's stale.
//  3. The leader is cut off with B's client (a minority that still believes
//     it leads for a moment): on the majority a new leader expires B's
//     session and grants C. The majority says C's token is current and B's
//     stale; a checker that reaches only the old leader gets an error, never
//     "B is current" (the read is linearizable, not served from the deposed
//     leader's state).
func TestCheckTokenAcrossFailover(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	ctx := t.Context()
	const ttl = 2 * time.Second
	const lock = "fence/stock"
	checker := c.newClient("checker")
	current := func(cl *lockd.Client, token uint64) bool {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		st, err := cl.CheckToken(cctx, lock, token)
		if err != nil {
			t.Fatalf("CheckToken(%d): %v", token, err)
		}
		return st.Current
	}

	a := newMember(t, c, "a", lock, ttl)
	if err := a.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	tA := a.m.Token()
	li := c.leaderIndex()
	c.stop(li, true)
	if _, err := c.waitLeader(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !current(checker, tA) {
		t.Errorf("right after the failover: A's token %d is stale, want current", tA)
	}
	if current(checker, tA+1) {
		t.Errorf("token %d was never granted, but is current", tA+1)
	}
	if ok, err := a.m.CheckToken(ctx); !ok || err != nil {
		t.Errorf("A's Mutex.CheckToken: %v, %v; want true", ok, err)
	}

	b := newMember(t, c, "b", lock, ttl)
	if err := a.m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	tB := b.m.Token()
	if current(checker, tA) || !current(checker, tB) {
		t.Fatalf("after the handover: A's token current=%v, B's current=%v; want false, true", current(checker, tA), current(checker, tB))
	}

	// Bring the crashed node back so that the majority survives a cut.
	if _, err := c.healAndRestart(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	old := c.leaderIndex()
	var rest []int
	for i := range c.nodes {
		if i != old {
			rest = append(rest, i)
		}
	}
	stale := c.newClient("stale-reader")
	c.restrictClient("b", []int{old})
	c.restrictClient("stale-reader", []int{old})
	c.restrictClient("checker", rest)
	c.partition([]int{old}, rest)

	cm := newMember(t, c, "c", lock, ttl)
	c.restrictClient("c", rest)
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := cm.m.Lock(lctx); err != nil { // granted once B's session expires on the majority
		t.Fatalf("C: %v", err)
	}
	tC := cm.m.Token()
	if !current(checker, tC) || current(checker, tB) {
		t.Errorf("on the majority: C's token current=%v, B's current=%v; want true, false", current(checker, tC), current(checker, tB))
	}
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	defer scancel()
	if st, err := stale.CheckToken(sctx, lock, tB); err == nil {
		t.Errorf("through the deposed leader only: B's token %d answered %+v, want an error", tB, st)
	}
}
