package conformance

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// env is what a case runs against: a one-node cluster and the driver
// command.
type env struct {
	one    *cluster
	driver []string
}

// checker collects a case's failures, so that the suite's self-test can
// run a case against a broken driver and see it fail. Errors in setting a
// case up are t.Fatal as usual.
type checker struct {
	t    *testing.T
	mu   sync.Mutex
	errs []string
}

func (c *checker) Errorf(format string, a ...any) {
	c.t.Helper()
	msg := fmt.Sprintf(format, a...)
	c.mu.Lock()
	c.errs = append(c.errs, msg)
	c.mu.Unlock()
	c.t.Log("check failed: " + msg)
}

func (c *checker) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.errs) > 0
}

func (e *env) start(t *testing.T, name string) *driver {
	t.Helper()
	return startDriver(t, name, e.driver, e.one.endpoints(), "")
}

// session opens a session on d named "s" with the ttl and owner.
func session(d *driver, ttl time.Duration, owner string) string {
	d.t.Helper()
	a := d.must(map[string]any{"op": "open_session", "session": "s", "ttl_ms": ttl.Milliseconds(), "owner": owner})
	return a.str("session_id")
}

// hold is one grant seen by the suite: from the lock's answer to the
// unlock's request, on the driver's clock (one machine: one clock).
type hold struct {
	driver     string
	token      uint64
	start, end int64
}

// checkExclusive checks that holds of one lock never overlap and that
// their tokens strictly increase in grant order.
func checkExclusive(ck *checker, holds []hold) {
	sort.Slice(holds, func(i, j int) bool { return holds[i].start < holds[j].start })
	for i := 1; i < len(holds); i++ {
		p, h := holds[i-1], holds[i]
		if h.start <= p.end {
			ck.Errorf("overlap: %s held from %d to %d, %s granted at %d", p.driver, p.start, p.end, h.driver, h.start)
		}
		if h.token <= p.token {
			ck.Errorf("tokens not increasing in grant order: %s got %d after %s's %d", h.driver, h.token, p.driver, p.token)
		}
	}
}

// caseMutualExclusion: three driver processes contend for one lock;
// holds never overlap and tokens strictly increase.
func caseMutualExclusion(t *testing.T, e *env, ck *checker) {
	const drivers, rounds = 3, 8
	name := "conf/mutex"
	var mu sync.Mutex
	var holds []hold
	var wg sync.WaitGroup
	for i := range drivers {
		d := e.start(t, fmt.Sprintf("mx%d", i))
		session(d, 10*time.Second, fmt.Sprintf("mx%d", i))
		wg.Go(func() {
			for range rounds {
				a := d.call(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": name, "timeout_ms": 30000}, 60*time.Second)
				if !a.OK {
					ck.Errorf("%s: lock: %s", d.name, a)
					return
				}
				if g := d.call(map[string]any{"op": "guarded", "lock": "l"}, 10*time.Second); !g.OK || g.num("token") != a.num("token") {
					ck.Errorf("%s: guarded while holding: %s", d.name, g)
				}
				u := d.call(map[string]any{"op": "unlock", "lock": "l"}, 60*time.Second)
				if !u.OK {
					ck.Errorf("%s: unlock: %s", d.name, u)
				}
				mu.Lock()
				holds = append(holds, hold{driver: d.name, token: a.num("token"), start: a.T1, end: u.T0})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(holds) != drivers*rounds {
		ck.Errorf("%d holds, want %d", len(holds), drivers*rounds)
	}
	checkExclusive(ck, holds)
}

// caseBusy: a try_lock of a held lock answers busy naming the holder's
// owner; once released it is granted.
func caseBusy(t *testing.T, e *env, ck *checker) {
	d1, d2 := e.start(t, "busy1"), e.start(t, "busy2")
	session(d1, 10*time.Second, "holder-one")
	session(d2, 10*time.Second, "second")
	name := "conf/busy"
	d1.must(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": name})
	a := d2.call(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": name}, 30*time.Second)
	if a.code() != "busy" {
		ck.Errorf("try_lock of a held lock: %s, want busy", a)
	} else if a.Error.Holder != "holder-one" {
		ck.Errorf("busy names holder %q, want %q", a.Error.Holder, "holder-one")
	}
	d1.must(map[string]any{"op": "unlock", "lock": "l"})
	if a := d2.call(map[string]any{"op": "try_lock", "session": "s", "lock": "l", "name": name}, 30*time.Second); !a.OK {
		ck.Errorf("try_lock after release: %s", a)
	}
}

// casePause: a driver holding a lock is stopped (SIGSTOP) past its TTL.
// The deadline it used (asked after SIGCONT: the one its last confirmed
// keepalive gave) must come before the server's expiry of the session
// (ListSessions' expires_at, same machine, same clock); after SIGCONT its
// guarded answer is lease_lost, it reports the loss, and its token is
// refused by check_token and by a fence that saw the next holder's.
func casePause(t *testing.T, e *env, ck *checker) {
	p, next := e.start(t, "paused"), e.start(t, "next")
	const ttl = 2 * time.Second // renewed every 667 ms: room for a busy machine before the pause
	sid := session(p, ttl, "paused")
	session(next, 10*time.Second, "next")
	name := "conf/pause"
	old := p.must(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": name, "timeout_ms": 10000}).num("token")
	if g := p.call(map[string]any{"op": "guarded", "lock": "l"}, 10*time.Second); !g.OK {
		ck.Errorf("guarded right after the grant: %s", g)
	}
	// The deadline before the pause: the one asked after it may only be
	// later (a renewal confirmed in between), never earlier, so that a
	// driver cannot pass the deadline check by answering 0 once lost.
	before := time.Unix(0, int64(p.must(map[string]any{"op": "session_deadline", "session": "s"}).num("deadline")))
	node := e.one.nodes[0]
	p.pause(t)
	paused := time.Now()
	expires, gone := sessionExpiry(t, e.one, node, sid, 30*time.Second)
	p.resume(t)
	t.Logf("paused %v; server expired the session at %v after the pause (seen gone at %v)",
		time.Since(paused).Round(time.Millisecond), expires.Sub(paused).Round(time.Millisecond), gone.Sub(paused).Round(time.Millisecond))
	if expires.IsZero() {
		t.Fatal("ListSessions gave no expires_at for the session")
	}
	dl := time.Unix(0, int64(p.must(map[string]any{"op": "session_deadline", "session": "s"}).num("deadline")))
	if dl.Before(before) {
		ck.Errorf("the deadline asked after the pause %v is earlier than the one asked before it %v: session_deadline must answer the deadline the client used", dl.Format(time.StampMilli), before.Format(time.StampMilli))
	}
	if !dl.Before(expires) {
		ck.Errorf("the client's deadline %v is not before the server's expiry %v (by %v)", dl.Format(time.StampMilli), expires.Format(time.StampMilli), dl.Sub(expires))
	} else {
		t.Logf("client deadline %v before the server's expiry", expires.Sub(dl).Round(time.Millisecond))
	}
	if g := p.call(map[string]any{"op": "guarded", "lock": "l"}, 10*time.Second); g.code() != "lease_lost" {
		ck.Errorf("guarded after the pause: %s, want lease_lost", g)
	}
	// Generous: guarded already answered lease_lost, the event is due at
	// once, but a loaded machine may be slow to schedule the driver.
	if _, ok := p.waitEvent(10*time.Second, func(ev map[string]any) bool { return ev["event"] == "lease_lost" && ev["session"] == "s" }); !ok {
		ck.Errorf("no lease_lost event within 10s after the pause")
	}
	// The next holder writes to a fence; the paused one's late write is
	// refused there and by check_token.
	tok := next.must(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": name, "timeout_ms": 10000}).num("token")
	if tok <= old {
		ck.Errorf("next holder's token %d not above the paused one's %d", tok, old)
	}
	fence := tok // the highest token the resource has seen
	if g := p.call(map[string]any{"op": "guarded", "lock": "l"}, 10*time.Second); g.OK {
		if g.num("token") >= fence {
			ck.Errorf("paused driver's token %d passes a fence at %d", g.num("token"), fence)
		} else {
			ck.Errorf("paused driver would still write (guarded ok, token %d; the fence refuses it)", g.num("token"))
		}
	}
	if a := p.must(map[string]any{"op": "check_token", "name": name, "token": old}); a.Fields["valid"] != false {
		ck.Errorf("check_token of the paused driver's token %d: %s, want valid false", old, a)
	}
	if a := next.must(map[string]any{"op": "check_token", "name": name, "token": tok}); a.Fields["valid"] != true {
		ck.Errorf("check_token of the current token %d: %s, want valid true", tok, a)
	}
	next.must(map[string]any{"op": "unlock", "lock": "l"})
}

// caseCutMidAcquire: a driver waiting for a lock through a proxy has its
// connections cut while queued and again right after the holder released;
// it gets the lock exactly once (one grant event for its session), with
// the token the cluster granted, and no hold is left after it unlocks.
func caseCutMidAcquire(t *testing.T, e *env, ck *checker) {
	node := e.one.nodes[0]
	px := startProxy(t, node.api)
	holder := e.start(t, "cut-holder")
	waiter := startDriver(t, "cut-waiter", e.driver, px.url(), "")
	session(holder, 10*time.Second, "cut-holder")
	wid := session(waiter, 10*time.Second, "cut-waiter")
	name := "conf/cut"
	w := watchServer(t, e.one, node, name)
	holder.must(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": name, "timeout_ms": 10000})
	ch := waiter.send(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": name, "timeout_ms": 30000})
	if !pollUntil(20*time.Second, 10*time.Millisecond, func() bool { _, n := holders(t, e.one, node, name); return n == 1 }) {
		t.Fatal("the waiter never queued")
	}
	if n := px.cut(); n == 0 {
		t.Fatal("no connection through the proxy to cut")
	}
	holder.must(map[string]any{"op": "unlock", "lock": "l"})
	px.cut()
	var a answer
	select {
	case a = <-ch:
	case <-time.After(60 * time.Second):
		t.Fatal("the waiter's lock did not return within 60s")
	}
	if !a.OK {
		ck.Errorf("lock after the cut: %s", a)
		return
	}
	waiter.must(map[string]any{"op": "unlock", "lock": "l"})
	// Every event up to the release of the hold the driver reported, in
	// log order: a second grant to the waiter (a withdrawal and a new
	// acquire after the cut) comes before it and is counted.
	evs := w.waitFor(t, 20*time.Second, func(ev *lockdv1.WatchResponse) bool {
		return ev.GetSession() == wid && ev.GetKind() == lockdv1.EventKind_EVENT_KIND_RELEASED && ev.GetToken() == a.num("token")
	})
	var grants []uint64
	for _, ev := range evs {
		if ev.GetSession() == wid && ev.GetKind().String() == "EVENT_KIND_GRANTED" {
			grants = append(grants, ev.GetToken())
		}
	}
	if len(grants) != 1 || grants[0] != a.num("token") {
		ck.Errorf("waiter's grants %v, want exactly one, with its token %d", grants, a.num("token"))
	}
	if hs, _ := holders(t, e.one, node, name); len(hs) != 0 {
		ck.Errorf("holds left after the waiter's unlock: %v", hs)
	}
}

// caseWatchResume: a driver watching from a position through a proxy
// gets every event after it, across a cut connection and across a stop
// and a new watch from the last position it saw: the same events as the
// server's own watch, in order, none twice.
func caseWatchResume(t *testing.T, e *env, ck *checker) {
	node := e.one.nodes[0]
	px := startProxy(t, node.api)
	prefix := "conf/watch/"
	w := watchServer(t, e.one, node, prefix)
	wd := startDriver(t, "watcher", e.driver, px.url(), "")
	if !wd.has("watch") {
		skipCap(t, "watch")
	}
	d := e.start(t, "watch-load")
	session(d, 10*time.Second, "watch-load")
	cycle := func(n int) {
		for range n {
			d.must(map[string]any{"op": "lock", "session": "s", "lock": "l", "name": prefix + "a", "timeout_ms": 10000})
			d.must(map[string]any{"op": "unlock", "lock": "l"})
		}
	}
	isW := func(h string) func(map[string]any) bool {
		return func(ev map[string]any) bool { return ev["event"] == "watch" && ev["watch"] == h }
	}
	wd.must(map[string]any{"op": "watch", "watch": "w1", "prefix": prefix, "from": w.start})
	cycle(2)
	if _, ok := wd.waitEvent(10*time.Second, func(ev map[string]any) bool { return isW("w1")(ev) && len(wd.eventsOf(isW("w1"))) >= 4 }); !ok {
		t.Fatalf("watch w1: %d events before the cut, want 4", len(wd.eventsOf(isW("w1"))))
	}
	px.cut()
	cycle(2)
	if !pollUntil(15*time.Second, 10*time.Millisecond, func() bool { return len(wd.eventsOf(isW("w1"))) >= 8 }) {
		ck.Errorf("watch w1: %d events after the cut, want 8", len(wd.eventsOf(isW("w1"))))
	}
	wd.must(map[string]any{"op": "stop", "watch": "w1"})
	first := wd.eventsOf(isW("w1"))
	cycle(2)
	from := ""
	if len(first) > 0 {
		from, _ = first[len(first)-1]["position"].(string)
	}
	wd.must(map[string]any{"op": "watch", "watch": "w2", "prefix": prefix, "from": from})
	want := w.waitCount(t, 12, 10*time.Second)
	pollUntil(15*time.Second, 10*time.Millisecond, func() bool { return len(first)+len(wd.eventsOf(isW("w2"))) >= len(want) })
	got := append(first, wd.eventsOf(isW("w2"))...)
	var gotPos, wantPos []string
	for _, ev := range got {
		p, _ := ev["position"].(string)
		gotPos = append(gotPos, fmt.Sprintf("%s/%v/%d", p, ev["kind"], numOf(ev, "token")))
	}
	for _, ev := range want {
		wantPos = append(wantPos, fmt.Sprintf("%s/%s/%d", ev.GetPosition(), kindName(ev.GetKind().String()), ev.GetToken()))
	}
	if !slices.Equal(gotPos, wantPos) {
		ck.Errorf("watch events differ from the server's:\n got  %v\n want %v", gotPos, wantPos)
	}
}

// kindName is a proto EventKind name as the driver protocol spells it.
func kindName(s string) string {
	const p = "EVENT_KIND_"
	if len(s) > len(p) {
		s = s[len(p):]
	}
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
