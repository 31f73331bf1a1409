package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestMultiLockAllOrNothing on a real 3-node cluster: a set whose lock x is
// held is refused by TryLock holding nothing; Lock queues one request that
// holds nothing while it waits (a single TryLock of its free lock y is busy:
// the set heads y's queue), and takes x and y together, with new tokens,
// once x is released; a cancelled wait leaves no queue behind.
func TestMultiLockAllOrNothing(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	upgraded(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := newMember(t, c, "a", "x", 5*time.Second)
	if err := a.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	b := newMember(t, c, "b", "unused", 5*time.Second)
	set := b.s.NewMultiLock([]string{"y", "x"})
	if err := set.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
		t.Fatalf("TryLock of a set with x held: %v, want ErrBusy", err)
	}
	obs := c.newClient("observer")
	if y := describe(t, obs, "y", 5*time.Second); len(y.Holders)+len(y.Waiters) != 0 {
		t.Fatalf("a refused set left y %v", y)
	}

	granted := make(chan error, 1)
	go func() { granted <- set.Lock(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(describe(t, obs, "y", 5*time.Second).Waiters) != 1 || len(describe(t, obs, "x", 5*time.Second).Waiters) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the set did not queue on x and y")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if y := describe(t, obs, "y", 5*time.Second); len(y.Holders) != 0 {
		t.Fatalf("y held while the set waits for x: %v", y.Holders)
	}
	other := newMember(t, c, "other", "y", 5*time.Second)
	if err := other.m.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
		t.Fatalf("single TryLock of y behind the queued set: %v, want ErrBusy (FIFO)", err)
	}
	xTok := a.m.Token()
	if err := a.m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("set: %v", err)
	}
	toks := set.Tokens()
	if len(toks) != 2 || toks["x"] <= xTok || toks["y"] == 0 {
		t.Fatalf("tokens %v (x was %d)", toks, xTok)
	}
	for _, n := range []string{"x", "y"} {
		info := describe(t, obs, n, 5*time.Second)
		if len(info.Holders) != 1 || info.Holders[0].SessionId != b.s.ID() || info.Holders[0].Token != toks[n] {
			t.Fatalf("%s: holders %v, want the set's session with token %d", n, info.Holders, toks[n])
		}
	}
	// Release one, then the rest.
	if err := set.UnlockOne(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	if err := other.m.TryLock(ctx); err != nil {
		t.Fatalf("y after the set released it: %v", err)
	}
	if err := set.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A wait given up leaves no queue: a holds x again, the set waits,
	// its context ends, both queues are empty.
	if err := a.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := b.s.NewMultiLock([]string{"x", "z"}).Lock(wctx)
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("set wait past its deadline: %v", err)
	}
	for _, n := range []string{"x", "z"} {
		if w := describe(t, obs, n, 5*time.Second).Waiters; len(w) != 0 {
			t.Fatalf("%s: waiters %v after the set gave up", n, w)
		}
	}
}

// TestMultiLockNoDeadlock: clients take random pairs and triples of five
// locks, each set named in a random order, for a bounded number of rounds
// on a real 3-node cluster. Every set is granted whole (a checker sees no
// lock held twice and no set held in part), tokens per lock rise, and all
// rounds end: ordering never deadlocks sets. The time taken is logged.
func TestMultiLockNoDeadlock(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	upgraded(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	names := []string{"l0", "l1", "l2", "l3", "l4"}
	const clients, rounds = 6, 12
	var (
		mu     sync.Mutex
		held   = map[string]string{} // lock -> client holding it now
		last   = map[string]uint64{} // lock -> highest token seen
		grants int
	)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		mem := newMember(t, c, fmt.Sprintf("c%d", i), "unused", 15*time.Second) // long: a busy 2-core machine delays keepalives
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for range rounds {
				set := append([]string(nil), names...)
				r.Shuffle(len(set), func(a, b int) { set[a], set[b] = set[b], set[a] })
				set = set[:2+r.IntN(2)]
				ml := mem.s.NewMultiLock(set)
				if err := ml.Lock(ctx); err != nil {
					errs <- fmt.Errorf("client %d: %v: %w", i, set, err)
					return
				}
				toks := ml.Tokens()
				mu.Lock()
				for _, n := range set {
					if h, ok := held[n]; ok {
						mu.Unlock()
						errs <- fmt.Errorf("client %d got %s while client %s holds it", i, n, h)
						return
					}
					if toks[n] <= last[n] {
						mu.Unlock()
						errs <- fmt.Errorf("lock %s: token %d not above %d", n, toks[n], last[n])
						return
					}
					held[n], last[n] = mem.s.ID(), toks[n]
				}
				grants++
				mu.Unlock()
				// Held from the grant until just before Unlock: another
				// client granted one of these names meanwhile is caught.
				if ml.Context().Err() != nil {
					errs <- fmt.Errorf("client %d: set %v lost before its release: %w", i, set, context.Cause(ml.Context()))
					return
				}
				mu.Lock()
				for _, n := range set {
					delete(held, n)
				}
				mu.Unlock()
				if err := ml.Unlock(ctx); err != nil {
					errs <- fmt.Errorf("client %d unlock %v: %w", i, set, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if grants != clients*rounds {
		t.Fatalf("%d sets granted, want %d", grants, clients*rounds)
	}
	t.Logf("%d sets of 2–3 of 5 locks in random order by %d clients in %v", grants, clients, time.Since(start))
}

// TestDeadlockRefusedInOneRoundTrip on a real 3-node cluster: two
// sessions each hold one lock and ask for the other's; the first waits, the
// second is refused at once with ErrDeadlock naming both locks, and the
// first is granted once the second session lets go.
func TestDeadlockRefusedInOneRoundTrip(t *testing.T) {
	leakCheck(t)
	c := newTestCluster(t, 3, defaultClusterOpts())
	upgraded(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := newMember(t, c, "a", "la", 5*time.Second)
	b := newMember(t, c, "b", "lb", 5*time.Second)
	if err := a.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	aWants := a.s.NewMutex("lb")
	granted := make(chan error, 1)
	go func() { granted <- aWants.Lock(ctx) }()
	obs := c.newClient("observer")
	deadline := time.Now().Add(10 * time.Second)
	for len(describe(t, obs, "lb", 5*time.Second).Waiters) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a did not queue for lb")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Explain: la's holder (a) waits for lb, which b holds.
	ex, err := obs.Service().Explain(ctx, connect.NewRequest(&lockdv1.ExplainRequest{Name: "la"}))
	if err != nil {
		t.Fatal(err)
	}
	if ch := ex.Msg.GetChain(); len(ch) != 1 || ch[0].GetSessionId() != a.s.ID() || ch[0].GetLock() != "lb" || ch[0].GetBlockedBy() != b.s.ID() || !ch[0].GetHolding() || ch[0].GetDepth() != 1 {
		t.Fatalf("explain la: chain %v", ch)
	}
	err = b.s.NewMutex("la").Lock(ctx)
	if !errors.Is(err, lockd.ErrDeadlock) {
		t.Fatalf("b's wait for la: %v, want ErrDeadlock", err)
	}
	for _, want := range []string{`"la"`, `"lb"`, a.s.ID(), b.s.ID()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if w := describe(t, obs, "la", 5*time.Second).Waiters; len(w) != 0 {
		t.Fatalf("the refused wait queued: %v", w)
	}
	if err := b.m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("a's wait for lb: %v", err)
	}
}
