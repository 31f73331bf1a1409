package main

import (
	"slices"
	"time"
)

// SetStats counts the MultiLock grants the Go workers saw.
type SetStats struct {
	// Granted counts sets granted (one return carrying every token).
	Granted int `json:"granted"`
	// Split counts granted sets whose tokens were not issued by one grant
	// (a token missing, or not consecutive): violations.
	Split int `json:"split"`
}

// CycleStats counts the lock-order inversion rounds of the pair slots.
type CycleStats struct {
	// Rounds counts rounds in which both sides held their first name and
	// both asked for the other's with the two asks outstanding at once.
	Rounds int `json:"rounds"`
	// Refused counts rounds whose cycle was refused with DEADLOCK.
	Refused int `json:"refused"`
	// Unrefused counts rounds with no refusal, or one later than
	// RefuseBound, and no fault or lease loss to explain it: violations.
	Unrefused int `json:"unrefused"`
	// Excused counts rounds with no refusal, or a late one, while a fault
	// or a lease loss overlapped them: not judged.
	Excused int `json:"excused"`
	// Unjustified counts refusals the history shows no cycle for:
	// violations.
	Unjustified int `json:"unjustified"`
	// MaxRefuseMs is the longest time from the second ask to the refusal.
	MaxRefuseMs int64 `json:"maxRefuseMs"`
}

// sets checks that every granted set came from one grant. The cluster has
// one token counter, raised by one per grant, and a set's grant is one Raft
// entry that grants every name in a row: a set granted at once carries one
// token per name, consecutive, and no other grant can carry a token among
// them. A set granted piecemeal (part held while the rest was waited for)
// shows as a missing token or a gap (another grant, seen or not, took the
// tokens between). What this cannot see: a piecemeal grant with no other
// grant issued in between looks like one grant; the register's per-name
// fencing and the per-name linearizability check (a set is an acquire of
// each of its names over the set's interval) still judge each name's
// exclusivity between set and single holders.
func (c *checker) sets() {
	for _, e := range c.events {
		if e.Kind != kindReturn || e.Op != opAcquireMany || e.Result != resOK {
			continue
		}
		c.r.Sets.Granted++
		toks := slices.Clone(e.Tokens)
		slices.Sort(toks)
		switch {
		case len(toks) != len(e.Names) || slices.Contains(toks, 0):
			c.r.Sets.Split++
			c.violate("partial set grant: session %s got tokens %v for set %q: not one token per name", e.Session, e.Tokens, e.Names)
		case len(slices.Compact(slices.Clone(toks))) != len(toks) || toks[len(toks)-1]-toks[0] != uint64(len(toks)-1):
			c.r.Sets.Split++
			c.violate("partial set grant: session %s's set %q has tokens %v, not issued by one grant (one grant issues them in a row)", e.Session, e.Names, e.Tokens)
		}
	}
}

// pairAsk is one side's operations in an inversion round.
type pairAsk struct {
	session   string
	hold, ask *lockOp // the first name's acquire and the ask for the other's
}

// cycles checks the inversion rounds. Only a pair's two sessions use its
// two names, and each holds one while asking for the other, so a DEADLOCK
// refusal on those names can only be this round's cycle. Per round, once
// both held and both asks were outstanding at once:
//
//   - one refusal: the cycle was refused. The other side's ask must have
//     been sent before the refusal came back (else no cycle existed the
//     history can show: violation), and the refusal must come within
//     RefuseBound of the second ask (a wait that would close a cycle is
//     refused in one round trip, not left to time out), unless a fault or
//     a lease loss overlaps the round.
//   - two refusals: the first refusal queued nothing, so the second had
//     no cycle to close: violation.
//   - none: both sides waited in a cycle. A violation unless a fault
//     window or a lease loss overlaps the round (a lost lease ends a hold
//     and with it the cycle; a dead leader answers nothing).
//
// What the history cannot prove: that the other side's ask was already
// applied on the leader when the refusal was decided (only that it was
// sent before the refusal returned), nor anything of the waits-for graph
// beyond the pair's two names.
func (c *checker) cycles() {
	rounds := map[string][]*pairAsk{}
	var order []string
	type k2 struct {
		s  string
		id int64
	}
	pending := map[k2]*lockOp{}
	cut := map[*lockOp]bool{} // asks the run's end cancelled
	lost := map[string]int64{}
	end := int64(0)
	for _, e := range c.events {
		end = max(end, e.At)
		if e.Kind == kindLost {
			at := e.At
			if e.Sent != 0 {
				at = min(at, e.Sent)
			}
			lost[e.Session] = at
		}
		if e.Pair == "" || e.Op != opAcquire {
			continue
		}
		switch e.Kind {
		case kindInvoke:
			sides := rounds[e.Pair]
			if sides == nil {
				order = append(order, e.Pair)
			}
			var side *pairAsk
			for _, s := range sides {
				if s.session == e.Session {
					side = s
				}
			}
			if side == nil {
				side = &pairAsk{session: e.Session}
				rounds[e.Pair] = append(sides, side)
			}
			o := &lockOp{op: opAcquire, lock: e.Lock, session: e.Session, call: e.At, ret: never, result: resUnknown}
			if side.hold == nil {
				side.hold = o
			} else {
				side.ask = o
			}
			pending[k2{e.Session, e.OpID}] = o
		case kindReturn:
			if o := pending[k2{e.Session, e.OpID}]; o != nil {
				// An error return is when the client stopped waiting.
				o.ret, o.result, o.token = e.At, e.Result, e.Token
				cut[o] = e.Detail == detailRunEnded
			}
		}
	}
	bound := c.p.RefuseBound.Nanoseconds()
	for _, tag := range order {
		sides := rounds[tag]
		if len(sides) != 2 || !sides[0].complete() || !sides[1].complete() {
			continue
		}
		a, b := sides[0].ask, sides[1].ask
		if !(a.call < b.ret && b.call < a.ret) {
			// The asks were never both outstanding: no cycle formed, so
			// there must be no refusal either.
			for _, o := range []*lockOp{a, b} {
				if o.result == resDeadlock {
					c.r.Cycles.Unjustified++
					c.violate("refusal without a cycle: round %s refused %s with DEADLOCK before the other side asked (or after its ask ended)", tag, o.session)
				}
			}
			continue
		}
		from := max(a.call, b.call)
		to := min(a.ret, b.ret)
		if to == never {
			to = end
		}
		if (a.ret == never || cut[a]) && (b.ret == never || cut[b]) && to-from <= bound {
			// Each ask was still out when the history ended or cancelled
			// by the run's end, too soon after the second for a refusal
			// to be due: the run cut the round off, it proves nothing
			// either way. (An ask that returned otherwise is judged.)
			continue
		}
		c.r.Cycles.Rounds++
		excused := c.faultBetween(from, to) || c.lostBefore(lost, sides, to)
		var refused []*lockOp
		for _, o := range []*lockOp{a, b} {
			if o.result == resDeadlock {
				refused = append(refused, o)
			}
		}
		switch len(refused) {
		case 2:
			c.r.Cycles.Unjustified++
			c.violate("refusal without a cycle: round %s refused both %s and %s with DEADLOCK; the first refusal queued nothing, so the second closed no cycle", tag, a.session, b.session)
		case 1:
			c.r.Cycles.Refused++
			x := refused[0]
			wait := x.ret - from
			c.r.Cycles.MaxRefuseMs = max(c.r.Cycles.MaxRefuseMs, wait/1e6)
			if wait > bound {
				if excused {
					c.r.Cycles.Excused++
				} else {
					c.r.Cycles.Unrefused++
					c.violate("cycle refused late: round %s, %s refused %v after the second ask, beyond %v with no fault", tag, x.session, time.Duration(wait).Round(time.Millisecond), c.p.RefuseBound)
				}
			}
		default:
			if excused {
				c.r.Cycles.Excused++
				continue
			}
			c.r.Cycles.Unrefused++
			c.violate("cycle not refused: round %s, %s (holding %q) and %s (holding %q) each asked for the other's lock; neither was refused with DEADLOCK (results %s, %s after %v), no fault or lease loss",
				tag, a.session, sides[0].hold.lock, b.session, sides[1].hold.lock, a.result, b.result, time.Duration(to-from).Round(time.Millisecond))
		}
	}
}

// complete reports whether the side held its first name and asked for the
// other's.
func (p *pairAsk) complete() bool {
	return p.hold != nil && p.hold.result == resOK && p.ask != nil && p.hold.ret < p.ask.call
}

// faultBetween reports whether any fault window overlaps [from, to].
func (c *checker) faultBetween(from, to int64) bool {
	for _, w := range c.windows {
		if w.start <= to && w.end+c.p.Slack.Nanoseconds() >= from {
			return true
		}
	}
	return false
}

// lostBefore reports whether a side's session was seen lost by to.
func (c *checker) lostBefore(lost map[string]int64, sides []*pairAsk, to int64) bool {
	for _, s := range sides {
		if at, ok := lost[s.session]; ok && at <= to {
			return true
		}
	}
	return false
}

// onlyKind reports whether every fault overlapping [from, to] is of kind.
func (c *checker) onlyKind(kind string, from, to int64) bool {
	for _, w := range c.windows {
		if w.kind != kind && w.start <= to && w.end >= from {
			return false
		}
	}
	return true
}
