package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// tokensOf reads multi_lock's "tokens" result: one token per name.
func tokensOf(a answer) map[string]uint64 {
	m, _ := a.Fields["tokens"].(map[string]any)
	out := map[string]uint64{}
	for k, v := range m {
		if n, ok := v.(json.Number); ok {
			var x uint64
			if _, err := fmt.Sscan(n.String(), &x); err == nil {
				out[k] = x
			}
		}
	}
	return out
}

// multi asks d for the set names under lock handle "m".
func multi(d *driver, names []string, try bool, timeoutMs int64) <-chan answer {
	return d.send(map[string]any{"op": "multi_lock", "session": "s", "lock": "m", "names": names, "try": try, "timeout_ms": timeoutMs})
}

func wait(t *testing.T, ch <-chan answer, d time.Duration, what string) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
	return answer{}
}

// caseMultiLockAllOrNothing: a set of two locks, one of them held by a
// single holder, is refused whole (busy) when not waiting and queued whole
// when waiting: meanwhile the other lock has no holder and a try_lock of
// it is busy (the set heads its queue). On the release the set is granted
// whole, one token per name, each above the name's earlier tokens; on its
// unlock both locks are free.
func caseMultiLockAllOrNothing(t *testing.T, e *env, ck *checker) {
	ds := needCap(t, e, "multilock", 3)
	holder, set, other := ds[0], ds[1], ds[2]
	a, b := "conf/multi/a", "conf/multi/b"
	node := e.one.nodes[0]
	ta := holder.must(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": a}).num("token")
	tb := other.must(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": b}).num("token")
	other.must(map[string]any{"op": "unlock", "lock": "l"})
	if r := wait(t, multi(set, []string{a, b}, true, 0), 30*time.Second, "try multi_lock"); r.code() != "busy" {
		ck.Errorf("try multi_lock with %s held: %s, want busy", a, r)
	}
	if hs, _ := holders(t, e.one, node, b); len(hs) != 0 {
		ck.Errorf("after a refused set, %s has holders %v: part of a set held", b, hs)
	}
	ch := multi(set, []string{a, b}, false, 30000)
	if !pollUntil(20*time.Second, 10*time.Millisecond, func() bool { _, w := holders(t, e.one, node, b); return w == 1 }) {
		t.Fatalf("the set never queued on %s", b)
	}
	if hs, _ := holders(t, e.one, node, b); len(hs) != 0 {
		ck.Errorf("while the set waits, %s has holders %v: part of a set held", b, hs)
	}
	if r := other.call(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": b}, 30*time.Second); r.code() != "busy" {
		ck.Errorf("try_lock of %s with a set queued on it: %s, want busy", b, r)
		if r.OK {
			other.must(map[string]any{"op": "unlock", "lock": "l"})
		}
	}
	holder.must(map[string]any{"op": "unlock", "lock": "l"})
	r := wait(t, ch, 40*time.Second, "multi_lock")
	if !r.OK {
		ck.Errorf("multi_lock after the release: %s", r)
		return
	}
	toks := tokensOf(r)
	if len(toks) != 2 || toks[a] <= ta || toks[b] <= tb || toks[a] == toks[b] {
		ck.Errorf("set tokens %v: want one per name, %s above %d, %s above %d", toks, a, ta, b, tb)
	}
	ha, _ := holders(t, e.one, node, a)
	hb, _ := holders(t, e.one, node, b)
	if len(ha) != 1 || !slices.Equal(ha, hb) {
		ck.Errorf("granted set: holders of %s %v, of %s %v; want the set's session on both", a, ha, b, hb)
	}
	if g := set.call(map[string]any{"op": "guarded", "lock": "m"}, 10*time.Second); !g.OK {
		ck.Errorf("guarded while holding the set: %s", g)
	}
	if r := other.call(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": b}, 30*time.Second); r.code() != "busy" {
		ck.Errorf("try_lock of %s held by the set: %s, want busy", b, r)
	}
	set.must(map[string]any{"op": "unlock", "lock": "m"})
	for _, n := range []string{a, b} {
		if hs, w := holders(t, e.one, node, n); len(hs) != 0 || w != 0 {
			ck.Errorf("after the set's unlock %s has holders %v, %d waiters", n, hs, w)
		}
	}
	if r := other.call(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": b}, 30*time.Second); !r.OK || r.num("token") <= toks[b] {
		ck.Errorf("try_lock of %s after the set: %s, want a token above %d", b, r, toks[b])
	}
}

// caseMultiLockNoDeadlock: two drivers take the same two locks as sets in
// opposite orders, round after round: every request is granted in turn
// (no deadlock, no refusal), the holds of each lock never overlap and its
// tokens increase in grant order.
func caseMultiLockNoDeadlock(t *testing.T, e *env, ck *checker) {
	ds := needCap(t, e, "multilock", 2)
	const rounds = 6
	x, y := "conf/multi/x", "conf/multi/y"
	orders := [][]string{{x, y}, {y, x}}
	var mu sync.Mutex
	holds := map[string][]hold{}
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() {
			for range rounds {
				a := d.call(map[string]any{"op": "multi_lock", "session": "s", "lock": "m", "names": orders[i], "timeout_ms": 30000}, 60*time.Second)
				if !a.OK {
					ck.Errorf("%s: multi_lock %v: %s", d.name, orders[i], a)
					return
				}
				u := d.call(map[string]any{"op": "unlock", "lock": "m"}, 60*time.Second)
				if !u.OK {
					ck.Errorf("%s: unlock: %s", d.name, u)
				}
				toks := tokensOf(a)
				mu.Lock()
				for _, n := range []string{x, y} {
					holds[n] = append(holds[n], hold{driver: d.name, token: toks[n], start: a.T1, end: u.T0})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, n := range []string{x, y} {
		if len(holds[n]) != 2*rounds {
			ck.Errorf("%s: %d holds, want %d", n, len(holds[n]), 2*rounds)
		}
		checkExclusive(ck, holds[n])
	}
}

// caseHoldBudgetClientFirst: a holder asks a 2 s hold budget (its session's
// TTL is 10 s). The lock deadline its client reports is before the server
// may end the hold (the grant's granted_at plus the budget the server
// returned: the leader starts the budget's timer when it applies the grant,
// after granted_at). Stopped with SIGSTOP until the server has ended the
// hold and granted a waiter, it answers guarded with lease_lost once
// resumed, and the waiter's token is higher (it fences the old one).
func caseHoldBudgetClientFirst(t *testing.T, e *env, ck *checker) {
	ds := needCap(t, e, "max_hold", 2)
	p, next := ds[0], ds[1]
	const budget = 2 * time.Second
	name := "conf/budget"
	node := e.one.nodes[0]
	a := p.must(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": name, "timeout_ms": 10000, "max_hold_ms": budget.Milliseconds()})
	dl := int64(p.must(map[string]any{"op": "lock_deadline", "lock": "l"}).num("deadline"))
	h := holdOf(t, e.one, node, name)
	if h == nil || h.GetToken() != a.num("token") {
		t.Fatalf("the server does not list the grant: %v", h)
	}
	if got := h.GetMaxHold().AsDuration(); got != budget {
		ck.Errorf("server's budget %v, want %v", got, budget)
	}
	serverEnd := h.GetGrantedAt().AsTime().Add(h.GetMaxHold().AsDuration()).UnixNano()
	if dl >= serverEnd {
		ck.Errorf("lock_deadline %d is not before the server's earliest end of the hold %d (by %v)", dl, serverEnd, time.Duration(dl-serverEnd))
	}
	if dl <= a.T0 {
		ck.Errorf("lock_deadline %d before the lock was even asked (%d)", dl, a.T0)
	}
	ch := next.send(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": name, "timeout_ms": 30000})
	p.pause(t)
	n := wait(t, ch, 40*time.Second, "the waiter's lock")
	p.resume(t)
	if !n.OK {
		ck.Errorf("waiter after the budget: %s", n)
		return
	}
	if n.num("token") <= a.num("token") {
		ck.Errorf("waiter's token %d does not fence the old holder's %d", n.num("token"), a.num("token"))
	}
	if n.T1 <= dl {
		ck.Errorf("the waiter had the lock (%d) before the old holder's lock_deadline %d", n.T1, dl)
	}
	if g := p.call(map[string]any{"op": "guarded", "lock": "l"}, 10*time.Second); g.code() != "lease_lost" {
		ck.Errorf("guarded past the hold budget: %s, want lease_lost", g)
	}
	if v := p.call(map[string]any{"op": "check_token", "name": name, "token": a.num("token")}, 10*time.Second); p.has("check_token") && (!v.OK || v.Fields["valid"] != false) {
		ck.Errorf("check_token of the ended hold's token: %s, want valid false", v)
	}
}

// holdOf returns the first holder of a lock as the server lists it.
func holdOf(t *testing.T, c *cluster, s *server, name string) *lockdv1.Holder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.api(s).DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
	if err != nil {
		t.Fatalf("describe %s: %v", name, err)
	}
	if hs := resp.Msg.GetLock().GetHolders(); len(hs) > 0 {
		return hs[0]
	}
	return nil
}
