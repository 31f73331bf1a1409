package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// planted builds a history as the register would record it: events at
// given milliseconds, fed to a register in time order when checked.
type planted struct {
	t        *testing.T
	events   []plantedEvent
	ids      int64
	unfenced bool // a backend without tokens (Redlock)
}

type plantedEvent struct {
	ms int64
	e  Event
}

func newPlanted(t *testing.T) *planted { return &planted{t: t} }

const base = int64(1_000_000) // ms; times are Unix-like, never 0

func (p *planted) at(ms int64, e Event) {
	if e.Sent == 0 {
		e.Sent = (base + ms) * 1e6
	}
	p.events = append(p.events, plantedEvent{ms, e})
}

// drop removes the last planted event.
func (p *planted) drop() { p.events = p.events[:len(p.events)-1] }

// op records a Go worker's call: invoke at call, return at ret (ret < 0:
// never returned).
func (p *planted) op(call, ret int64, slot, session, op, lock, result string, token uint64) {
	p.ids++
	p.at(call, Event{Kind: kindInvoke, Slot: slot, Session: session, Op: op, OpID: p.ids, Lock: lock})
	if ret >= 0 {
		p.at(ret, Event{Kind: kindReturn, Slot: slot, Session: session, Op: op, OpID: p.ids, Lock: lock, Result: result, Token: token})
	}
}

// cs records a critical section's messages at the given times: begin, writes, end.
func (p *planted) cs(slot, client, lock string, token uint64, times ...int64) {
	for i, ms := range times {
		kind := kindWrite
		switch i {
		case 0:
			kind = kindBegin
		case len(times) - 1:
			kind = kindEnd
		}
		p.at(ms, Event{Kind: kind, Slot: slot, Client: client, Lock: lock, Token: token})
	}
}

func (p *planted) check() *Report {
	p.t.Helper()
	reg := newRegister()
	reg.unfenced = p.unfenced
	evs := slices.Clone(p.events)
	slices.SortStableFunc(evs, func(a, b plantedEvent) int { return cmp.Compare(a.ms, b.ms) })
	for _, pe := range evs {
		if _, err := reg.recordAt(pe.e, (base+pe.ms)*1e6); err != nil {
			p.t.Fatal(err)
		}
	}
	r := &Report{}
	check(reg.close(), checkParams{Slack: 500 * time.Millisecond, Liveness: 5 * time.Second, LinearTimeout: 10 * time.Second, Unfenced: p.unfenced, RefuseBound: 2 * time.Second}, r)
	return r
}

func hasViolation(r *Report, substr string) bool {
	for _, v := range r.Violations {
		if strings.Contains(v, substr) {
			return true
		}
	}
	return false
}

// A clean history: two Go workers and a lockd run client take one lock in
// turn; the register accepts everything.
func TestCheckClean(t *testing.T) {
	p := newPlanted(t)
	p.at(0, Event{Kind: kindOpen, Slot: "w0", Session: "A"})
	p.at(0, Event{Kind: kindOpen, Slot: "w1", Session: "B"})
	p.op(1, 5, "w0", "A", opAcquire, "x", resOK, 10)
	p.cs("w0", "w0:A", "x", 10, 6, 10, 14)
	p.op(15, 17, "w0", "A", opRelease, "x", resOK, 0)
	p.op(2, 20, "w1", "B", opAcquire, "x", resOK, 11)
	p.cs("w1", "w1:B", "x", 11, 21, 25, 29)
	p.op(30, 32, "w1", "B", opRelease, "x", resOK, 0)
	p.cs("r1", "r1:0", "x", 12, 40, 50, 60)
	p.op(70, 72, "w0", "A", opClose, "", resOK, 0)
	r := p.check()
	if len(r.Violations) != 0 || r.Linear != "ok" {
		t.Fatalf("violations %q, linearizable %s; want none, ok", r.Violations, r.Linear)
	}
	if r.Ops.Acquired != 2 || r.Ops.Runs != 3 || r.Ops.Writes != 6 || r.Ops.Released != 2 {
		t.Errorf("ops %+v, want 2 acquired, 3 runs, 6 writes, 2 released", r.Ops)
	}
}

// Acceptance 1: each planted fault is reported.
func TestCheckPlanted(t *testing.T) {
	for _, tt := range []struct {
		name  string
		plant func(p *planted)
		want  func(r *Report) bool
		says  string
	}{{
		// Two holders granted at once (lockd run clients, so only the
		// register sees them): the older keeps writing after the newer
		// began, with no pause to explain it.
		name: "double grant",
		plant: func(p *planted) {
			p.cs("r1", "r1:0", "x", 10, 0, 10, 30, 40)
			p.cs("r2", "r2:0", "x", 11, 5, 15, 25)
		},
		want: func(r *Report) bool { return r.Overlaps.Unsafe == 1 && r.Ops.Rejected == 3 },
		says: "unsafe overlap",
	}, {
		name: "shared token",
		plant: func(p *planted) {
			p.cs("r1", "r1:0", "x", 10, 0, 10, 20)
			p.cs("r2", "r2:0", "x", 10, 30, 40, 50)
		},
		want: func(r *Report) bool { return r.Shared == 1 },
		says: "shared token",
	}, {
		name: "shared token interleaved",
		plant: func(p *planted) {
			p.cs("r1", "r1:0", "x", 10, 0, 10, 20)
			p.cs("r2", "r2:0", "x", 10, 5, 15, 25)
		},
		want: func(r *Report) bool { return r.Shared == 1 && r.Overlaps.Unsafe == 1 },
		says: "interleave",
	}, {
		// The cluster acknowledged token 20, then granted 15 to a later
		// acquire: it forgot the first grant.
		name: "lost ack",
		plant: func(p *planted) {
			p.op(0, 5, "w0", "A", opAcquire, "x", resOK, 20)
			p.op(10, 12, "w0", "A", opRelease, "x", resOK, 0)
			p.op(20, 25, "w1", "B", opAcquire, "y", resOK, 15)
		},
		want: func(r *Report) bool { return r.LostAcks == 1 },
		says: "lost ack",
	}, {
		// B is granted the lock while A holds it and before A releases.
		name: "non-linearizable",
		plant: func(p *planted) {
			p.op(0, 5, "w0", "A", opAcquire, "x", resOK, 10)
			p.op(10, 15, "w1", "B", opAcquire, "x", resOK, 11)
			p.op(20, 22, "w0", "A", opRelease, "x", resOK, 0)
			p.op(30, 32, "w1", "B", opRelease, "x", resOK, 0)
		},
		want: func(r *Report) bool { return r.Linear == "illegal" },
		says: "not linearizable",
	}, {
		// A releases while B is queued; nothing is granted for longer
		// than the liveness bound, with no fault going on.
		name: "missed wake-up",
		plant: func(p *planted) {
			p.op(0, 5, "w0", "A", opAcquire, "x", resOK, 10)
			p.op(2, -1, "w1", "B", opAcquire, "x", "", 0)
			p.op(10, 12, "w0", "A", opRelease, "x", resOK, 0)
			p.cs("r1", "r1:0", "y", 11, 6000, 6010)
		},
		want: func(r *Report) bool { return r.Missed == 1 },
		says: "missed wake-up",
	}} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlanted(t)
			tt.plant(p)
			r := p.check()
			if !tt.want(r) || !hasViolation(r, tt.says) {
				t.Errorf("report %+v\nviolations %q; want one saying %q", r, r.Violations, tt.says)
			}
			if testing.Verbose() {
				t.Log(r.Violations)
			}
		})
	}
}

// Fencing working is counted, not a violation: the stale holder's message
// arrives right after a pause of its client and is rejected.
func TestCheckFencedOverlap(t *testing.T) {
	p := newPlanted(t)
	p.at(0, Event{Kind: kindOpen, Slot: "w0", Session: "A"})
	p.op(1, 5, "w0", "A", opAcquire, "x", resOK, 10)
	p.cs("w0", "w0:A", "x", 10, 6, 8)
	p.drop() // no end: paused mid-section
	p.at(9, Event{Kind: kindFault, Fault: faultClientPauseGo, Target: "w0", OpID: 1})
	p.op(2, 3000, "w1", "B", opAcquire, "x", resOK, 11)
	p.cs("w1", "w1:B", "x", 11, 3001, 3010, 3020)
	p.op(3021, 3022, "w1", "B", opRelease, "x", resOK, 0)
	p.at(4000, Event{Kind: kindHeal, Fault: faultClientPauseGo, Target: "w0", OpID: 1})
	p.at(4001, Event{Kind: kindWrite, Slot: "w0", Client: "w0:A", Lock: "x", Token: 10, Sent: (base + 8) * 1e6})
	p.at(4002, Event{Kind: kindLost, Slot: "w0", Session: "A"})
	r := p.check()
	if len(r.Violations) != 0 || r.Overlaps.Fenced != 1 || r.Linear != "ok" {
		t.Fatalf("violations %q, overlaps %+v, linearizable %s; want none, 1 fenced, ok", r.Violations, r.Overlaps, r.Linear)
	}
	// The same stale write 2 s after the pause ended is the client's bug.
	p.at(6001, Event{Kind: kindWrite, Slot: "w0", Client: "w0:A", Lock: "x", Token: 10})
	if r := p.check(); r.Overlaps.Unsafe != 1 || !hasViolation(r, "unsafe overlap") {
		t.Fatalf("violations %q, overlaps %+v; want 1 unsafe", r.Violations, r.Overlaps)
	}
}

// A missed wake-up while a fault is still going on is unavailability, not
// a liveness violation.
func TestCheckLivenessDuringFault(t *testing.T) {
	p := newPlanted(t)
	p.at(0, Event{Kind: kindFault, Fault: faultPauseNode, Target: "n1", OpID: 1})
	p.op(0, 5, "w0", "A", opAcquire, "x", resOK, 10)
	p.op(2, -1, "w1", "B", opAcquire, "x", "", 0)
	p.op(10, 12, "w0", "A", opRelease, "x", resOK, 0)
	p.at(7000, Event{Kind: kindHeal, Fault: faultPauseNode, Target: "n1", OpID: 1})
	if r := p.check(); r.Missed != 0 || r.Faults[faultPauseNode] != 1 {
		t.Fatalf("missed %d, faults %v; want 0 and one %s", r.Missed, r.Faults, faultPauseNode)
	}
}

// Unavailability per kind: a gap overlapping two kinds counts for both in
// Unavail, and only in UnavailAlone for a kind it overlaps alone.
func TestCheckUnavailabilityAlone(t *testing.T) {
	p := newPlanted(t)
	p.cs("r1", "r1:0", "x", 1, 0, 10)
	p.at(100, Event{Kind: kindFault, Fault: faultPauseNode, Target: "n1", OpID: 1})
	p.at(3000, Event{Kind: kindHeal, Fault: faultPauseNode, Target: "n1", OpID: 1})
	p.at(3500, Event{Kind: kindFault, Fault: faultKillLeader, Target: "n2", OpID: 2})
	p.at(3600, Event{Kind: kindHeal, Fault: faultKillLeader, Target: "n2", OpID: 2})
	p.cs("r1", "r1:1", "x", 2, 4000, 4010) // a 4 s gap over both faults
	p.at(5000, Event{Kind: kindFault, Fault: faultKillLeader, Target: "n3", OpID: 3})
	p.at(5100, Event{Kind: kindHeal, Fault: faultKillLeader, Target: "n3", OpID: 3})
	p.cs("r1", "r1:2", "x", 3, 6000, 6010) // a 2 s gap over one kill alone
	r := p.check()
	if r.Unavail[faultPauseNode] != 4000 || r.Unavail[faultKillLeader] != 4000 {
		t.Errorf("unavailability %v; want 4000 ms for both kinds", r.Unavail)
	}
	if r.UnavailAlone[faultPauseNode] != 0 || r.UnavailAlone[faultKillLeader] != 2000 {
		t.Errorf("unavailability alone %v; want pause 0, leader kill 2000 ms", r.UnavailAlone)
	}
}

// A session whose acquire ended in an error and that was then lost (or
// closed) waits for nothing: a release after that owes it no grant. Seen
// in a short profile under load: a worker's session was lost during a
// partition, and 60 s later a release of that lock counted it as a waiter
// nobody served.
func TestCheckLivenessEndedWaiter(t *testing.T) {
	p := newPlanted(t)
	p.at(0, Event{Kind: kindOpen, Slot: "w1", Session: "B"})
	p.op(0, 5, "w0", "A", opAcquire, "x", resOK, 10)
	p.op(2, 1000, "w1", "B", opAcquire, "x", resUnknown, 0)
	p.at(1000, Event{Kind: kindLost, Slot: "w1", Session: "B"})
	p.op(1001, 1002, "w1", "B", opClose, "", resOK, 0)
	p.op(2000, 2002, "w0", "A", opRelease, "x", resOK, 0)
	p.cs("r1", "r1:0", "y", 11, 9000, 9010)
	if r := p.check(); r.Missed != 0 {
		t.Fatalf("missed %d (%q); want 0: B's session had ended", r.Missed, r.Violations)
	}
}

// The register over HTTP: equal and higher tokens pass, a lower one is
// rejected (and recorded).
func TestRegisterFences(t *testing.T) {
	reg := newRegister()
	url, err := reg.start()
	if err != nil {
		t.Fatal(err)
	}
	defer reg.stop()
	rep := newReporter(url, "r1")
	ctx := context.Background()
	for _, tt := range []struct {
		kind  string
		token uint64
		stale bool
	}{{kindBegin, 5, false}, {kindWrite, 5, false}, {kindBegin, 7, false}, {kindWrite, 5, true}, {kindEnd, 7, false}, {kindBegin, 0, true}} {
		err := rep.send(ctx, Event{Kind: tt.kind, Lock: "x", Client: "c", Token: tt.token})
		if got := errors.Is(err, errStale); got != tt.stale || err != nil && !got {
			t.Errorf("%s token %d: %v, want stale %v", tt.kind, tt.token, err, tt.stale)
		}
	}
	events := reg.close()
	if len(events) != 6 || events[3].Accepted || !events[4].Accepted || events[5].Seq != 6 {
		t.Errorf("events %+v", events)
	}
}

// The command line: usage errors exit 64; `chaos check` re-checks a
// recorded history and exits 1 on a violation, 0 on a clean one.
func TestMainCheckAndUsage(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"--nodes", "4"}, {"--profile", "medium"}, {"--clients", "1"}, {"--broken", "nope"}, {"extra"}, {"check"}} {
		var out, errOut strings.Builder
		if code := Main(ctx, args, &out, &errOut); code != exitUsage {
			t.Errorf("chaos %q: exit %d, want %d (stderr %q)", args, code, exitUsage, errOut.String())
		}
	}
	dir := t.TempDir()
	write := func(name string, p *planted) string {
		t.Helper()
		reg := newRegister()
		for _, pe := range p.events {
			if _, err := reg.recordAt(pe.e, (base+pe.ms)*1e6); err != nil {
				t.Fatal(err)
			}
		}
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := writeHistory(f, reg.close()); err != nil {
			t.Fatal(err)
		}
		return path
	}
	clean, bad := newPlanted(t), newPlanted(t)
	clean.cs("r1", "r1:0", "x", 10, 0, 10, 20)
	bad.cs("r1", "r1:0", "x", 10, 0, 10, 20)
	bad.cs("r2", "r2:0", "x", 10, 30, 40, 50)
	for _, tt := range []struct {
		path string
		want int
	}{{write("clean.jsonl", clean), exitOK}, {write("bad.jsonl", bad), exitViolation}, {filepath.Join(dir, "missing"), exitHarness}} {
		var out, errOut strings.Builder
		if code := Main(ctx, []string{"check", tt.path}, &out, &errOut); code != tt.want {
			t.Errorf("chaos check %s: exit %d, want %d: %s%s", tt.path, code, tt.want, out.String(), errOut.String())
		}
	}
}

// Many lost sessions in a row, each lock handed to the next session after
// its holder's lease ran out, each leaving an acquire of unknown outcome
// open to the end, then a double grant: still proved illegal, quickly
// (unknown outcomes that change nothing do not multiply the search).
func TestCheckManyLostSessions(t *testing.T) {
	p := newPlanted(t)
	const n = 40
	var end int64
	for i := range n {
		s, slot := fmt.Sprintf("S%d", i), fmt.Sprintf("w%d", i%3)
		t0 := int64(i) * 40_000 // ms
		p.at(t0, Event{Kind: kindOpen, Slot: slot, Session: s})
		p.op(t0+1, t0+5, slot, s, opAcquire, "x", resOK, uint64(10+i))
		p.op(t0+6, -1, slot, s, opAcquire, "y", "", 0) // outcome unknown
		p.at(t0+3000, Event{Kind: kindLost, Slot: slot, Session: s})
		end = t0 + 40_000
	}
	p.op(end, end+5, "w0", "A", opAcquire, "x", resOK, 1000)
	p.op(end+10, end+15, "w1", "B", opAcquire, "x", resOK, 1001)
	start := time.Now()
	r := p.check()
	if r.Linear != "illegal" {
		t.Fatalf("linearizable %s, violations %q; want illegal", r.Linear, r.Violations)
	}
	t.Logf("%d lost sessions and a double grant: illegal in %v", n, time.Since(start).Round(time.Millisecond))
}

// A backend without tokens (Redlock): the register accepts token 0, so two
// holders acting at once interleave their accepted writes, reported as an
// unsafe overlap that is also unfenced, and the mutex model finds the
// double grant; one token 0 shared by every holder is not a shared token.
// A clean token-0 history passes. With tokens, a grant without one is a
// violation.
func TestCheckUnfenced(t *testing.T) {
	p := newPlanted(t)
	p.unfenced = true
	p.op(0, 10, "w0", "s1", opAcquire, "L", resOK, 0)
	p.cs("w0", "w0:s1:0", "L", 0, 20, 30, 40)
	p.op(50, 60, "w0", "s1", opRelease, "L", resOK, 0)
	p.op(55, 70, "w1", "s2", opAcquire, "L", resOK, 0)
	p.cs("w1", "w1:s2:0", "L", 0, 80, 90, 100)
	p.op(110, 120, "w1", "s2", opRelease, "L", resOK, 0)
	if r := p.check(); len(r.Violations) != 0 || r.Linear != "ok" || r.Ops.Runs != 2 {
		t.Fatalf("clean token-0 history: violations %v, linearizable %s, ops %+v", r.Violations, r.Linear, r.Ops)
	}
	// A third holder granted while the second still holds, acting at once.
	p.op(85, 88, "w2", "s3", opAcquire, "L", resOK, 0)
	p.cs("w2", "w2:s3:0", "L", 0, 89, 95, 105)
	r := p.check()
	if r.Overlaps.Unsafe != 1 || r.Overlaps.Unfenced != 1 || r.Shared != 0 || r.Linear != "illegal" {
		t.Fatalf("overlaps %+v, shared %d, linearizable %s; want 1 unsafe, 1 unfenced, 0 shared, illegal; violations %v", r.Overlaps, r.Shared, r.Linear, r.Violations)
	}
	if !hasViolation(r, "interleave") {
		t.Errorf("no interleaving reported: %v", r.Violations)
	}

	q := newPlanted(t)
	q.op(0, 10, "w0", "s1", opAcquire, "L", resOK, 0)
	if r := q.check(); !hasViolation(r, "grant without a token") {
		t.Errorf("lockd grant with token 0 not reported: %v", r.Violations)
	}
}

// On a Redis backend the violations are the measurement: exit 0 unless
// --strict; on lockd they fail the run.
func TestExitForBackend(t *testing.T) {
	bad := &Report{Violations: []string{"unsafe overlap"}}
	for _, tc := range []struct {
		backend string
		strict  bool
		r       *Report
		want    int
	}{
		{backendLockd, false, bad, exitViolation},
		{backendLockd, false, &Report{}, exitOK},
		{backendRedis, false, bad, exitOK},
		{backendRedlock, false, bad, exitOK},
		{backendRedisAOF, true, bad, exitViolation},
		{backendRedisAOF, true, &Report{}, exitOK},
	} {
		if got := exitFor(&config{Backend: tc.backend, Strict: tc.strict}, tc.r); got != tc.want {
			t.Errorf("backend %s strict %v violations %d: exit %d, want %d", tc.backend, tc.strict, len(tc.r.Violations), got, tc.want)
		}
	}
}
