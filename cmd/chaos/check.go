package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// checkParams are the bounds the checker judges a history by.
type checkParams struct {
	// Slack is how long after a client pause ends (or how long a message
	// may travel) a stale holder's message still counts as fenced, not
	// unsafe: a correct client notices its lost lease at once on resume.
	Slack time.Duration
	// Liveness bounds the wait of a queued acquire after the lock was
	// released, once every fault has healed: TTL + grace + lock-delay +
	// election timeout, plus slack for a loaded machine.
	Liveness time.Duration
	// LinearTimeout bounds the porcupine search; an exhausted search is
	// reported as unknown, not as a pass.
	LinearTimeout time.Duration
	// Unfenced: the backend issues no fencing token (Redlock), so grants
	// carry 0; otherwise a grant without a token is a violation.
	Unfenced bool
	// RefuseBound bounds how long a lock-order cycle may stand before its
	// closing wait is refused, outside fault windows (check_sets.go).
	RefuseBound time.Duration
}

// Report is the JSON report of one run.
type Report struct {
	// Seed replays the run's schedule and choices (--seed).
	Seed uint64 `json:"seed"`
	// Backend is lockd, redis, redis-aof or redlock.
	Backend string `json:"backend,omitempty"`
	// Profile is short or long.
	Profile string `json:"profile,omitempty"`
	// Nodes is the cluster size.
	Nodes int `json:"nodes,omitempty"`
	// Clients is the number of client slots.
	Clients int `json:"clients,omitempty"`
	// Broken names the deliberate bug of the run, if any.
	Broken string `json:"broken,omitempty"`
	// Duration is the run's wall time.
	Duration string `json:"duration,omitempty"`
	// History is the path of the raw history (JSON lines).
	History string `json:"history,omitempty"`
	// Ops counts the operations.
	Ops Ops `json:"operations"`
	// Faults counts the injected faults by kind.
	Faults map[string]int `json:"faults"`
	// Overlaps counts holders acting at once on one lock.
	Overlaps Overlaps `json:"overlaps"`
	// LostAcks counts grants whose token is not above a grant
	// acknowledged before they were asked for.
	LostAcks int `json:"lostAcks"`
	// Shared counts tokens carried by two holders.
	Shared int `json:"sharedTokens"`
	// Linear is the porcupine verdict: ok, illegal, unknown, or none (no
	// Go worker operations).
	Linear string `json:"linearizable"`
	// Missed counts missed wake-ups after the last fault healed.
	Missed int `json:"missedWakeups"`
	// Latency is the Go workers' acquire latency, queueing included.
	Latency Latency `json:"acquireLatencyMs"`
	// Unavail is the longest stretch without any successful grant
	// overlapping a fault, per fault kind, in milliseconds.
	Unavail map[string]int64 `json:"unavailabilityMs"`
	// UnavailAlone is the same, counting only stretches that overlap
	// faults of that one kind: in a long run faults follow each other
	// closely, and a stretch caused by one kind (a hung disk) also counts
	// in Unavail for the kind injected next.
	UnavailAlone map[string]int64 `json:"unavailabilityAloneMs"`
	// Sets and Cycles are the MultiLock and lock-order inversion checks.
	Sets   SetStats   `json:"sets"`
	Cycles CycleStats `json:"cycles"`
	// Violations describes every violation found (at most 200).
	Violations []string `json:"violations"`
	// Errors describes harness failures (a node that did not restart, a
	// client that crashed): the run proves nothing then.
	Errors []string `json:"harnessErrors,omitempty"`
}

// Ops counts operations by outcome.
type Ops struct {
	// Acquired counts the Go workers' Lock calls that returned a grant.
	Acquired int `json:"acquired"`
	// AcquireFail counts the Go workers' Lock calls that returned an error.
	AcquireFail int `json:"acquireFails"`
	// Released counts the Go workers' acknowledged Unlock calls.
	Released int `json:"released"`
	// Runs counts critical sections begun (accepted begin messages).
	Runs int `json:"runs"`
	// Writes counts accepted write and end messages.
	Writes int `json:"writesAccepted"`
	// Rejected counts fenced messages the register rejected as stale.
	Rejected int `json:"writesRejected"`
	// LeaseLost counts lock operations ended by a lease loss (per lock the
	// session used).
	LeaseLost int `json:"leasesLost"`
}

// Overlaps counts pairs of holders that acted at once on one lock.
type Overlaps struct {
	// Unsafe overlaps are violations.
	Unsafe int `json:"unsafe"`
	// Fenced overlaps are stale holders the register rejected right after
	// their client was paused: fencing working.
	Fenced int `json:"fenced"`
	// Unfenced counts the unsafe overlaps whose writes the register
	// accepted on both sides, interleaved: the resource itself saw two
	// holders at once (with tokens only a shared token allows that;
	// without, as on Redlock, every overlap is one). The other unsafe
	// overlaps were caught by the register's token check.
	Unfenced int `json:"unfenced"`
}

// Latency is acquire latency percentiles in milliseconds.
type Latency struct {
	// P50 is the median.
	P50 float64 `json:"p50"`
	// P99 is the 99th percentile.
	P99 float64 `json:"p99"`
}

// window is one fault, from injection to heal.
type window struct {
	kind, target string
	start, end   int64
}

// faultWindows pairs each fault event with its heal (by OpID); a fault
// never healed lasts to the end of the history.
func faultWindows(events []Event) []window {
	var ws []window
	open := map[int64]int{}
	last := int64(0)
	for _, e := range events {
		last = max(last, e.At)
		switch e.Kind {
		case kindFault:
			open[e.OpID] = len(ws)
			ws = append(ws, window{kind: e.Fault, target: e.Target, start: e.At, end: -1})
		case kindHeal:
			if i, ok := open[e.OpID]; ok {
				ws[i].end = e.At
				delete(open, e.OpID)
			}
		}
	}
	for i := range ws {
		if ws[i].end < 0 {
			ws[i].end = last
		}
	}
	return ws
}

// checker holds one pass over a history.
type checker struct {
	p       checkParams
	events  []Event
	windows []window
	r       *Report
}

func (c *checker) violate(format string, args ...any) {
	if len(c.r.Violations) < 200 {
		c.r.Violations = append(c.r.Violations, fmt.Sprintf(format, args...))
	}
}

// check runs every check on events and fills r (its counters and
// violations); r.Violations empty means the run is clean.
func check(events []Event, p checkParams, r *Report) {
	slices.SortStableFunc(events, func(a, b Event) int { return cmp.Compare(a.Seq, b.Seq) })
	c := &checker{p: p, events: events, windows: faultWindows(events), r: r}
	if r.Faults == nil {
		r.Faults = map[string]int{}
	}
	for _, w := range c.windows {
		r.Faults[w.kind]++
	}
	c.fencing()
	ops := collectOps(events, c.windows)
	c.counts(ops)
	c.tokens(ops)
	r.Linear = c.linearizable(ops)
	c.liveness(ops)
	c.unavailability(ops)
	c.sets()
	c.cycles()
	if r.Violations == nil {
		r.Violations = []string{}
	}
}

// pausedAround reports whether slot was paused or killed by a fault whose
// window, extended by the slack, contains at.
func (c *checker) pausedAround(slot string, at int64) bool {
	for _, w := range c.windows {
		if w.target == slot && strings.HasPrefix(w.kind, "client-") && at >= w.start && at <= w.end+c.p.Slack.Nanoseconds() {
			return true
		}
	}
	return false
}

// csRun is one critical section as the register saw it.
type csRun struct {
	lock, client, slot string
	token              uint64
	first, last        int64 // Seq of the first and last accepted message; 0 if none
	rejected           []Event
}

// fencing checks the register's messages: shared tokens, accepted writes
// of two runs interleaving (unsafe), and stale messages the register
// rejected, which are fenced when a client pause or a slow delivery
// explains them and unsafe otherwise (the holder acted after the server
// had granted the lock to a newer token: a correct lockd client knows its
// lease is gone before the server may forget it).
func (c *checker) fencing() {
	runs := map[string]*csRun{}
	var order []*csRun
	owners := map[uint64]map[string]bool{} // token → clients that began with it
	for _, e := range c.events {
		if !e.fenced() {
			continue
		}
		key := fmt.Sprintf("%s\x00%s\x00%d", e.Lock, e.Client, e.Token)
		rn := runs[key]
		if rn == nil {
			rn = &csRun{lock: e.Lock, client: e.Client, slot: e.Slot, token: e.Token}
			runs[key] = rn
			order = append(order, rn)
		}
		if e.Kind == kindBegin {
			if owners[e.Token] == nil {
				owners[e.Token] = map[string]bool{}
			}
			owners[e.Token][e.Client] = true
		}
		if e.Accepted {
			if rn.first == 0 {
				rn.first = e.Seq
			}
			rn.last = e.Seq
			if e.Kind == kindBegin {
				c.r.Ops.Runs++
			} else {
				c.r.Ops.Writes++
			}
		} else {
			c.r.Ops.Rejected++
			rn.rejected = append(rn.rejected, e)
		}
	}
	for tok, cl := range owners {
		if len(cl) > 1 && tok != 0 {
			c.r.Shared++
			c.violate("shared token: token %d began critical sections of %d holders: %s", tok, len(cl), strings.Join(sortedKeys(cl), ", "))
		}
	}
	// Accepted messages of two runs on one lock interleaving.
	byLock := map[string][]*csRun{}
	for _, rn := range order {
		if rn.first != 0 {
			byLock[rn.lock] = append(byLock[rn.lock], rn)
		}
	}
	for lock, rs := range byLock {
		slices.SortFunc(rs, func(a, b *csRun) int { return cmp.Compare(a.first, b.first) })
		for i := 1; i < len(rs); i++ {
			if prev := rs[i-1]; rs[i].first < prev.last {
				c.r.Overlaps.Unsafe++
				c.r.Overlaps.Unfenced++
				c.violate("unsafe overlap on %q: accepted writes of %s (token %d, #%d..#%d) and %s (token %d, #%d..#%d) interleave",
					lock, prev.client, prev.token, prev.first, prev.last, rs[i].client, rs[i].token, rs[i].first, rs[i].last)
			}
		}
	}
	// Stale messages.
	for _, rn := range order {
		if len(rn.rejected) == 0 {
			continue
		}
		unexplained := 0
		var first Event
		for _, e := range rn.rejected {
			late := e.Sent != 0 && e.At-e.Sent > c.p.Slack.Nanoseconds()
			if !c.pausedAround(e.Slot, e.At) && !late {
				if unexplained == 0 {
					first = e
				}
				unexplained++
			}
		}
		if unexplained == 0 {
			c.r.Overlaps.Fenced++
			continue
		}
		c.r.Overlaps.Unsafe++
		c.violate("unsafe overlap on %q: %s (token %d) acted after a newer holder began, %d message(s) with no client pause to explain them, first %s",
			rn.lock, rn.client, rn.token, unexplained, first.String())
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// counts fills the operation counters and the acquire latency.
func (c *checker) counts(ops []lockOp) {
	var lat []float64
	for _, o := range ops {
		switch {
		case o.op == opAcquire && o.result == resOK:
			c.r.Ops.Acquired++
			lat = append(lat, float64(o.ret-o.call)/1e6)
		case o.op == opAcquire:
			c.r.Ops.AcquireFail++
		case o.op == opRelease && o.result == resOK:
			c.r.Ops.Released++
		case o.op == opExpire:
			c.r.Ops.LeaseLost++
		}
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return math.Round(lat[min(len(lat)-1, int(p*float64(len(lat))))]*10) / 10
	}
	c.r.Latency = Latency{P50: pct(0.50), P99: pct(0.99)}
}

// tokens checks the grants the Go workers saw: a token is never handed to
// two sessions, and a grant asked for after another grant was acknowledged
// carries a larger token (the counter is one for the whole cluster; a
// smaller one means the cluster forgot an acknowledged grant).
func (c *checker) tokens(ops []lockOp) {
	var grants []lockOp
	holder := map[uint64]string{}
	for _, o := range ops {
		if o.op != opAcquire || o.result != resOK {
			continue
		}
		if o.token == 0 {
			if !c.p.Unfenced {
				c.violate("grant without a token: %s on %q", o.session, o.lock)
			}
			continue
		}
		if h, ok := holder[o.token]; ok && h != o.session {
			c.r.Shared++
			c.violate("shared token: token %d granted to sessions %s and %s", o.token, h, o.session)
		}
		holder[o.token] = o.session
		grants = append(grants, o)
	}
	// Sweep by time: the largest token acknowledged before each call.
	byRet := slices.Clone(grants)
	slices.SortFunc(byRet, func(a, b lockOp) int { return cmp.Compare(a.ret, b.ret) })
	slices.SortFunc(grants, func(a, b lockOp) int { return cmp.Compare(a.call, b.call) })
	var best lockOp
	j := 0
	for _, g := range grants {
		for ; j < len(byRet) && byRet[j].ret < g.call; j++ {
			if byRet[j].token > best.token {
				best = byRet[j]
			}
		}
		if best.token != 0 && g.token <= best.token {
			c.r.LostAcks++
			c.violate("lost ack: %s got token %d on %q after token %d (%q, %s) was acknowledged: the cluster forgot a grant",
				g.session, g.token, g.lock, best.token, best.lock, best.session)
		}
	}
}

// liveness reports a missed wake-up: after the last fault healed, a lock
// was released (or its holder's lease was lost) while another session was
// queued for it, and no grant followed within the liveness bound. It also
// reports a queued acquire that never returned although the lock was free
// for longer than the bound before the history ended.
func (c *checker) liveness(ops []lockOp) {
	var healed int64
	for _, w := range c.windows {
		healed = max(healed, w.end)
	}
	end := int64(0)
	for _, e := range c.events {
		end = max(end, e.At)
	}
	bound := c.p.Liveness.Nanoseconds()
	begins := map[string][]int64{} // lock → accepted begins (lockd run clients are served too)
	for _, e := range c.events {
		if e.Kind == kindBegin && e.Accepted {
			begins[e.Lock] = append(begins[e.Lock], e.At)
		}
	}
	byLock := map[string][]lockOp{}
	for _, o := range ops {
		byLock[o.lock] = append(byLock[o.lock], o)
	}
	for lock, los := range byLock {
		// When each session ended (closed, or lost): from then on it
		// waits for nothing, even if its last acquire's outcome is open.
		ended := map[string]int64{}
		for _, o := range los {
			if o.op == opExpire || o.op == opClose && o.result == resOK {
				if at, ok := ended[o.session]; !ok || o.call < at {
					ended[o.session] = o.call
				}
			}
		}
		for _, rel := range los {
			if rel.op != opRelease || rel.result != resOK || rel.ret < healed {
				continue
			}
			// A waiter of another session queued at the release.
			var waiter *lockOp
			for i := range los {
				w := &los[i]
				end, gone := ended[w.session]
				if w.op == opAcquire && w.session != rel.session && w.call < rel.ret && (w.ret > rel.ret || w.ret == never) && !(gone && end < rel.ret) {
					waiter = w
					break
				}
			}
			if waiter == nil || rel.ret+bound > end {
				continue
			}
			served := false
			for _, g := range los {
				if g.op == opAcquire && g.result == resOK && g.ret >= rel.ret && g.ret <= rel.ret+bound {
					served = true
					break
				}
			}
			for _, at := range begins[lock] {
				served = served || at >= rel.ret && at <= rel.ret+bound
			}
			if !served {
				c.r.Missed++
				c.violate("missed wake-up on %q: released by %s, %s queued since before, no grant within %v",
					lock, rel.session, waiter.session, c.p.Liveness)
			}
		}
	}
}

// unavailability measures, per fault kind, the longest gap between
// successive grants (Go worker grants and accepted begins) that overlaps
// one of its faults.
func (c *checker) unavailability(ops []lockOp) {
	var grants []int64
	for _, o := range ops {
		if o.op == opAcquire && o.result == resOK {
			grants = append(grants, o.ret)
		}
	}
	for _, e := range c.events {
		if e.Kind == kindBegin && e.Accepted {
			grants = append(grants, e.At)
		}
	}
	slices.Sort(grants)
	c.r.Unavail = map[string]int64{}
	c.r.UnavailAlone = map[string]int64{}
	for _, w := range c.windows {
		var longest, alone int64
		for i := 1; i < len(grants); i++ {
			if grants[i] >= w.start && grants[i-1] <= w.end {
				gap := grants[i] - grants[i-1]
				longest = max(longest, gap)
				if c.onlyKind(w.kind, grants[i-1], grants[i]) {
					alone = max(alone, gap)
				}
			}
		}
		c.r.Unavail[w.kind] = max(c.r.Unavail[w.kind], longest/1e6)
		c.r.UnavailAlone[w.kind] = max(c.r.UnavailAlone[w.kind], alone/1e6)
	}
}
