package conformance

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
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
