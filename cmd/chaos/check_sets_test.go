package main

import "testing"

// setOp plants a Go worker's MultiLock acquire of names, returning tokens
// (nil: no return).
func (p *planted) setOp(call, ret int64, slot, session string, names []string, tokens []uint64) {
	p.ids++
	p.at(call, Event{Kind: kindInvoke, Slot: slot, Session: session, Op: opAcquireMany, OpID: p.ids, Names: names})
	if ret >= 0 {
		p.at(ret, Event{Kind: kindReturn, Slot: slot, Session: session, Op: opAcquireMany, OpID: p.ids, Names: names, Result: resOK, Tokens: tokens})
	}
}

// pairOp plants one recorded operation of an inversion round.
func (p *planted) pairOp(call, ret int64, session, op, lock, result string, token uint64, tag string) {
	p.ids++
	p.at(call, Event{Kind: kindInvoke, Slot: "p6", Session: session, Op: op, OpID: p.ids, Lock: lock, Pair: tag})
	p.at(ret, Event{Kind: kindReturn, Slot: "p6", Session: session, Op: op, OpID: p.ids, Lock: lock, Pair: tag, Result: result, Token: token})
}

// plantSetAndRound plants a clean history: a set of two names held by S,
// then a single holder of one of them; and one inversion round in which B's
// ask closes the cycle and is refused at once, A is granted after B lets go.
func plantSetAndRound(p *planted, setTokens []uint64, refuseB string, refuseAt int64) {
	p.at(0, Event{Kind: kindOpen, Slot: "w0", Session: "S"})
	p.at(0, Event{Kind: kindOpen, Slot: "w2", Session: "T"})
	p.setOp(1, 5, "w0", "S", []string{"x", "y"}, setTokens)
	p.cs("w0", "w0:S", "x", setTokens[0], 6, 8, 10)
	p.cs("w0", "w0:S", "y", setTokens[1], 11, 13, 15)
	p.ids++
	p.at(16, Event{Kind: kindInvoke, Slot: "w0", Session: "S", Op: opReleaseMany, OpID: p.ids, Names: []string{"x", "y"}})
	p.at(18, Event{Kind: kindReturn, Slot: "w0", Session: "S", Op: opReleaseMany, OpID: p.ids, Names: []string{"x", "y"}, Result: resOK})
	p.op(2, 20, "w2", "T", opAcquire, "x", resOK, 30)
	p.cs("w2", "w2:T", "x", 30, 21, 23, 25)
	p.op(26, 28, "w2", "T", opRelease, "x", resOK, 0)

	p.at(100, Event{Kind: kindOpen, Slot: "p6", Session: "A"})
	p.at(100, Event{Kind: kindOpen, Slot: "p6", Session: "B"})
	p.pairOp(101, 105, "A", opAcquire, "px", resOK, 40, "p6:0")
	p.pairOp(101, 106, "B", opAcquire, "py", resOK, 41, "p6:0")
	// A is granted once B let go of py.
	grant := refuseAt + 6
	p.pairOp(110, grant, "A", opAcquire, "py", resOK, 42, "p6:0")
	p.pairOp(111, refuseAt, "B", opAcquire, "px", refuseB, 0, "p6:0")
	p.pairOp(refuseAt+1, refuseAt+3, "B", opRelease, "py", resOK, 0, "p6:0")
	p.pairOp(grant+1, grant+3, "A", opRelease, "py", resOK, 0, "p6:0")
	p.pairOp(grant+4, grant+6, "A", opRelease, "px", resOK, 0, "p6:0")
}

// A clean history with a set and a refused cycle has no violation.
func TestCheckSetsClean(t *testing.T) {
	p := newPlanted(t)
	plantSetAndRound(p, []uint64{20, 21}, resDeadlock, 114)
	r := p.check()
	if len(r.Violations) != 0 || r.Linear != "ok" {
		t.Fatalf("violations %q, linearizable %s; want none, ok", r.Violations, r.Linear)
	}
	if r.Sets.Granted != 1 || r.Sets.Split != 0 || r.Cycles.Rounds != 1 || r.Cycles.Refused != 1 {
		t.Errorf("sets %+v cycles %+v, want 1 set granted, 1 round refused", r.Sets, r.Cycles)
	}
}

// A round cut off by the end of the run (both asks out, the history ends
// sooner after the second than a refusal is due) is not judged: no
// violation, no round counted.
func TestCheckSetsRoundCutByTheEnd(t *testing.T) {
	p := newPlanted(t)
	plantSetAndRound(p, []uint64{20, 21}, resDeadlock, 114)
	p.pairOp(300, 310, "C", opAcquire, "qx", resOK, 50, "p6:1")
	p.pairOp(300, 311, "D", opAcquire, "qy", resOK, 51, "p6:1")
	p.ids++
	p.at(320, Event{Kind: kindInvoke, Slot: "p6", Session: "C", Op: opAcquire, OpID: p.ids, Lock: "qy", Pair: "p6:1"})
	p.ids++
	p.at(375, Event{Kind: kindInvoke, Slot: "p6", Session: "D", Op: opAcquire, OpID: p.ids, Lock: "qx", Pair: "p6:1"})
	r := p.check()
	if len(r.Violations) != 0 || r.Cycles.Rounds != 1 {
		t.Fatalf("violations %q, rounds %d; want none, 1 (the cut round not judged)", r.Violations, r.Cycles.Rounds)
	}
}

// A round whose asks the run's end cancelled soon after the second (both
// return unknown with detailRunEnded) is not judged either. It is judged
// when only one was cut (the other returned for a reason of its own), or
// when the cycle had stood past the bound before the cut.
func TestCheckSetsRoundCancelledByTheEnd(t *testing.T) {
	for _, tt := range []struct {
		name      string
		detailC   string
		detailD   string
		ret       int64 // both asks return at ret (asked at 320)
		violation string
		rounds    int
	}{
		{"both cut", detailRunEnded, detailRunEnded, 335, "", 1},
		{"neither cut", "", "", 335, "cycle not refused", 2},
		{"one cut", detailRunEnded, "", 335, "cycle not refused", 2},
		{"both cut past the bound", detailRunEnded, detailRunEnded, 2400, "cycle not refused", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanted(t)
			plantSetAndRound(p, []uint64{20, 21}, resDeadlock, 114)
			p.pairOp(300, 310, "C", opAcquire, "qx", resOK, 50, "p6:1")
			p.pairOp(300, 311, "D", opAcquire, "qy", resOK, 51, "p6:1")
			for _, side := range []struct{ s, lock, detail string }{{"C", "qy", tt.detailC}, {"D", "qx", tt.detailD}} {
				p.ids++
				p.at(320, Event{Kind: kindInvoke, Slot: "p6", Session: side.s, Op: opAcquire, OpID: p.ids, Lock: side.lock, Pair: "p6:1"})
				p.at(tt.ret, Event{Kind: kindReturn, Slot: "p6", Session: side.s, Op: opAcquire, OpID: p.ids, Lock: side.lock, Pair: "p6:1", Result: resUnknown, Detail: side.detail})
			}
			r := p.check()
			if tt.violation == "" && len(r.Violations) != 0 || tt.violation != "" && (len(r.Violations) != 1 || !hasViolation(r, tt.violation)) {
				t.Errorf("violations %q; want %q", r.Violations, tt.violation)
			}
			if r.Cycles.Rounds != tt.rounds {
				t.Errorf("rounds judged %d, want %d", r.Cycles.Rounds, tt.rounds)
			}
		})
	}
}

// The checker catches a set granted piecemeal, a cycle left to wait until
// the client gave up, and a refusal with no cycle.
func TestCheckSetsPlanted(t *testing.T) {
	for _, tt := range []struct {
		name  string
		plant func(p *planted)
		want  string
	}{
		{"set tokens with a gap", func(p *planted) {
			plantSetAndRound(p, []uint64{20, 22}, resDeadlock, 114)
		}, "partial set grant"},
		{"single holder inside a set's hold", func(p *planted) {
			plantSetAndRound(p, []uint64{20, 21}, resDeadlock, 114)
			// U is granted y while S's set still holds it, and writes.
			p.at(0, Event{Kind: kindOpen, Slot: "w4", Session: "U"})
			p.op(2, 7, "w4", "U", opAcquire, "y", resOK, 25)
			p.cs("w4", "w4:U", "y", 25, 8, 9, 10)
		}, "unsafe overlap on \"y\""},
		{"set with a token missing", func(p *planted) {
			plantSetAndRound(p, []uint64{20, 0}, resDeadlock, 114)
		}, "partial set grant"},
		{"cycle left waiting", func(p *planted) {
			// B's ask was not refused: it waited 10 s until its timeout.
			plantSetAndRound(p, []uint64{20, 21}, resUnknown, 10_111)
		}, "cycle not refused"},
		{"cycle refused late", func(p *planted) {
			plantSetAndRound(p, []uint64{20, 21}, resDeadlock, 5_111)
		}, "cycle refused late"},
		{"refusal before the other side asked", func(p *planted) {
			p.pairOp(300, 310, "C", opAcquire, "qx", resOK, 50, "p6:1")
			p.pairOp(300, 311, "D", opAcquire, "qy", resOK, 51, "p6:1")
			p.pairOp(320, 322, "C", opAcquire, "qy", resDeadlock, 0, "p6:1")
			p.pairOp(330, 340, "D", opAcquire, "qx", resOK, 52, "p6:1")
		}, "refusal without a cycle"},
		{"both sides refused", func(p *planted) {
			p.pairOp(300, 310, "C", opAcquire, "qx", resOK, 50, "p6:1")
			p.pairOp(300, 311, "D", opAcquire, "qy", resOK, 51, "p6:1")
			p.pairOp(320, 324, "C", opAcquire, "qy", resDeadlock, 0, "p6:1")
			p.pairOp(321, 325, "D", opAcquire, "qx", resDeadlock, 0, "p6:1")
		}, "refusal without a cycle"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanted(t)
			tt.plant(p)
			if r := p.check(); !hasViolation(r, tt.want) {
				t.Fatalf("violations %q, want one with %q", r.Violations, tt.want)
			}
		})
	}
}

// A cycle whose wait overlaps a fault is not judged (a dead leader
// answers nothing): counted as excused.
func TestCheckCycleExcusedByFault(t *testing.T) {
	p := newPlanted(t)
	plantSetAndRound(p, []uint64{20, 21}, resUnknown, 10_111)
	p.at(200, Event{Kind: kindFault, Fault: faultKillLeader, Target: "n1", OpID: 99})
	p.at(3000, Event{Kind: kindHeal, Fault: faultKillLeader, Target: "n1", OpID: 99})
	r := p.check()
	if len(r.Violations) != 0 || r.Cycles.Excused != 1 {
		t.Fatalf("violations %q, cycles %+v; want the round excused", r.Violations, r.Cycles)
	}
}
