package fsm_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// budgetSink records the lock events that concern hold budgets.
type budgetSink struct{ lines []string }

func (b *budgetSink) Events(_ uint64, evs []fsm.Event) {
	for _, e := range evs {
		switch e.Kind {
		case fsm.EventGranted:
			b.lines = append(b.lines, fmt.Sprintf("granted %s %s %d budget=%d", e.Name, e.Session, e.Token, e.DurationMs))
		case fsm.EventHoldExpired:
			b.lines = append(b.lines, fmt.Sprintf("hold expired %s %s %d", e.Name, e.Session, e.Token))
		case fsm.EventDelayStarted:
			b.lines = append(b.lines, fmt.Sprintf("delay %s %d", e.Name, e.DurationMs))
		}
	}
}
func (b *budgetSink) Reset(uint64) {}

func (b *budgetSink) take() []string {
	l := b.lines
	b.lines = nil
	return l
}

// TestHoldBudgetEffective: the grant's budget is the request's, else the
// policy's default, capped by the identity's ceiling; it is in the answer,
// the grant event (for the leader's timer), the hold's view, and a queued
// request keeps the budget it was decided with.
func TestHoldBudgetEffective(t *testing.T) {
	f := initFSM(t, nil)
	for _, id := range []string{"s1", "s2", "s3"} {
		mustOK(t, f, newSession(id))
	}
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "p", DefaultMaxHoldMs: 7000})
	if p, ok := f.Policy("p"); !ok || p.DefaultMaxHold != 7*time.Second {
		t.Fatalf("policy of p: %+v %v", p, ok)
	}
	cases := []struct {
		name          string
		asked, ceil   int64
		want          time.Duration
		lock, session string
	}{
		{"none", 0, 0, 0, "free", "s1"},
		{"asked", 3000, 0, 3 * time.Second, "a", "s1"},
		{"ceiling below asked", 5000, 2000, 2 * time.Second, "b", "s1"},
		{"ceiling above asked", 1000, 2000, time.Second, "c", "s1"},
		{"ceiling alone", 0, 2000, 2 * time.Second, "d", "s1"},
		{"policy default", 0, 0, 7 * time.Second, "p", "s1"},
		{"asked beats policy", 1000, 0, time.Second, "p", "s2"},
	}
	seq := map[string]uint64{}
	for _, c := range cases {
		seq[c.session]++
		a := acqLimit(c.session, seq[c.session], c.lock, shrd, false, 0)
		a.MaxHoldMs, a.MaxHoldCeilingMs = c.asked, c.ceil
		r := mustOK(t, f, a)
		if r.Status != fsm.StatusGranted || r.MaxHold != c.want {
			t.Errorf("%s: status %d budget %v, want granted with %v", c.name, r.Status, r.MaxHold, c.want)
		}
		l, _ := f.Describe(c.lock)
		i := slices.IndexFunc(l.Holders, func(h fsm.HolderInfo) bool { return h.Token == r.Token })
		if i < 0 || l.Holders[i].MaxHold != c.want {
			t.Errorf("%s: view %+v, want budget %v", c.name, l.Holders, c.want)
		}
	}
	// A queued request keeps the budget it was decided with, even when the
	// policy changes before its grant.
	mustOK(t, f, acq("s3", 1, "x", excl, false))
	q := acq("s1", 10, "x", excl, true)
	q.MaxHoldMs = 4000
	if r := mustOK(t, f, q); r.Status != fsm.StatusQueued {
		t.Fatalf("want queued, got %+v", r)
	}
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "x", DefaultMaxHoldMs: 9000})
	l, _ := f.Describe("x")
	mustOK(t, f, &fsmv1.Release{SessionId: "s3", Seq: 2, Name: "x", Token: l.Holders[0].Token})
	if st, _, _, b := f.WaitState("s1", "x", 10); st != fsm.StatusGranted || b != 4*time.Second {
		t.Fatalf("queued grant: status %d budget %v, want granted with 4s", st, b)
	}
	// Removing the policy: all zero.
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "p"})
	if _, ok := f.Policy("p"); ok {
		t.Fatal("policy p still set after its removal")
	}
}

// TestEndHold: EndHold ends exactly the hold it names, as an expiry ends it
// (the next waiter is granted, with a fresh token; a lock-delay starts when
// the lock has one), while the session lives on; a late EndHold (the hold
// released, or a token or session that does not match) and one decided in
// another term change nothing.
func TestEndHold(t *testing.T) {
	sink := &budgetSink{}
	f := initFSM(t, sink)
	for _, id := range []string{"s1", "s2"} {
		mustOK(t, f, newSession(id))
	}
	a := acq("s1", 1, "j", excl, false)
	a.MaxHoldMs = 1000
	t1 := mustOK(t, f, a).Token
	w := acq("s2", 1, "j", excl, true)
	w.MaxHoldMs = 2000
	mustOK(t, f, w)
	if got, want := sink.take(), []string{fmt.Sprintf("granted j s1 %d budget=1000", t1)}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	before := f.State().String()
	for _, e := range []*fsmv1.EndHold{
		{Name: "j", SessionId: "s2", Token: t1},     // another session
		{Name: "j", SessionId: "s1", Token: t1 + 5}, // another token
		{Name: "k", SessionId: "s1", Token: t1},     // another lock
	} {
		mustOK(t, f, e)
	}
	if f.State().String() != before || len(sink.take()) != 0 {
		t.Fatal("an EndHold of no live hold changed something")
	}
	mustOK(t, f, &fsmv1.EndHold{Name: "j", SessionId: "s1", Token: t1})
	got := sink.take()
	if len(got) < 2 || got[0] != fmt.Sprintf("hold expired j s1 %d", t1) || got[1] != fmt.Sprintf("granted j s2 %d budget=2000", t1+1) {
		t.Fatalf("events %q: want the hold ended and s2 granted with its budget", got)
	}
	if s, ok := f.Session("s1"); !ok || s.Holds != 0 {
		t.Fatalf("s1 after its hold's budget: %+v %v (want alive, holding nothing)", s, ok)
	}
	// A repeat of the same EndHold changes nothing (the hold is gone).
	st := f.State()
	mustOK(t, f, &fsmv1.EndHold{Name: "j", SessionId: "s1", Token: t1})
	if got := f.State(); got.String() != st.String() {
		t.Fatal("a repeated EndHold changed the state")
	}
	// A releasing holder's Release after its hold ended: not held.
	if r := apply(t, f, &fsmv1.Release{SessionId: "s1", Seq: 2, Name: "j", Token: t1}); r.Code != fsm.CodeNotHeld {
		t.Fatalf("release of an ended hold: %+v", r)
	}

	// With a lock-delay, the end of a hold starts it, as an expiry does.
	d := acq("s1", 3, "delayed", excl, false)
	d.MaxHoldMs, d.LockDelayMs = 1000, 5000
	td := mustOK(t, f, d).Token
	sink.take()
	mustOK(t, f, &fsmv1.EndHold{Name: "delayed", SessionId: "s1", Token: td})
	if got, want := sink.take(), []string{fmt.Sprintf("hold expired delayed s1 %d", td), "delay delayed 5000"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// TestEndHoldStaleTerm: an EndHold decided in one term and committed in
// another is refused, as a stale ExpireSession is.
func TestEndHoldStaleTerm(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	a := acq("s1", 1, "j", excl, false)
	a.MaxHoldMs = 1000
	tok := mustOK(t, f, a).Token
	data := cmd(t, &fsmv1.EndHold{Name: "j", SessionId: "s1", Token: tok, Term: 2})
	r := f.Apply(raftLog(3, 100, data)).(*fsm.Result)
	if r.Code != fsm.CodeInvalid {
		t.Fatalf("stale EndHold: %+v", r)
	}
	if l, ok := f.Describe("j"); !ok || len(l.Holders) != 1 {
		t.Fatalf("a stale EndHold ended the hold: %+v", l)
	}
	r = f.Apply(raftLog(2, 101, data)).(*fsm.Result)
	if l, ok := f.Describe("j"); r.Code != fsm.OK || ok && len(l.Holders) != 0 {
		t.Fatalf("EndHold of its own term: %+v, lock %+v", r, l)
	}
}

// TestHoldBudgetValidation: budgets, ceilings and policy defaults outside
// [0, 30 days] are refused with CodeInvalid, by the same check the server
// runs, and change nothing.
func TestHoldBudgetValidation(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	for i, a := range []*fsmv1.Acquire{
		{SessionId: "s1", Seq: 1, Name: "a", Mode: excl, MaxHoldMs: -1},
		{SessionId: "s1", Seq: 2, Name: "a", Mode: excl, MaxHoldMs: fsm.MaxHoldMs + 1},
		{SessionId: "s1", Seq: 3, Name: "a", Mode: excl, MaxHoldCeilingMs: -5},
	} {
		if fsm.ValidateAcquire(a) == nil {
			t.Errorf("%d: ValidateAcquire passed %v", i, a)
		}
		if r := apply(t, f, a); r.Code != fsm.CodeInvalid {
			t.Errorf("%d: Apply answered %+v", i, r)
		}
	}
	for _, p := range []*fsmv1.SetLockPolicy{{Name: "", DefaultMaxHoldMs: 1}, {Name: "a", DefaultMaxHoldMs: -1}, {Name: "a", DefaultMaxHoldMs: fsm.MaxHoldMs + 1}} {
		if fsm.ValidateSetLockPolicy(p) == nil {
			t.Errorf("ValidateSetLockPolicy passed %v", p)
		}
		if r := apply(t, f, p); r.Code != fsm.CodeInvalid {
			t.Errorf("SetLockPolicy %v: %+v", p, r)
		}
	}
	if st := f.State(); len(st.Locks) != 0 || len(st.Policies) != 0 {
		t.Fatalf("refused commands changed the state: %v", st)
	}
}

// TestPolicyCap: the policy table is capped; replacing an existing policy
// is not refused at the cap.
func TestPolicyCap(t *testing.T) {
	c := fsm.CurrentCaps()
	c.Policies = 2
	fsm.SetCaps(t, c)
	f := initFSM(t, nil)
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "a", DefaultMaxHoldMs: 1})
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "b", DefaultMaxHoldMs: 1})
	if r := apply(t, f, &fsmv1.SetLockPolicy{Name: "c", DefaultMaxHoldMs: 1}); r.Code != fsm.CodeTooMany {
		t.Fatalf("third policy: %+v", r)
	}
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "b", DefaultMaxHoldMs: 2})
}

// TestBudgetSnapshot: policies, hold and wait budgets survive a snapshot
// and restore byte for byte, and a snapshot with a bad one is refused.
func TestBudgetSnapshot(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, newSession("s2"))
	mustOK(t, f, &fsmv1.SetLockPolicy{Name: "a", DefaultMaxHoldMs: 7000})
	mustOK(t, f, acq("s1", 1, "a", excl, false))
	w := acq("s2", 1, "a", excl, true)
	w.MaxHoldMs = 3000
	mustOK(t, f, w)
	g := fsm.New(nil)
	if err := g.RestoreBytes(persist(t, f)); err != nil {
		t.Fatal(err)
	}
	a, b := f.State(), g.State()
	if a.String() != b.String() {
		t.Fatalf("restored state differs:\n%v\n%v", b, a)
	}
	if len(a.Policies) != 1 || a.Locks[0].Holders[0].MaxHoldMs != 7000 || a.Locks[0].Queue[0].MaxHoldMs != 3000 {
		t.Fatalf("state lacks the budgets: %v", a)
	}
	var seen []fsm.Budget
	g.WithBudgets(func(bs []fsm.Budget) { seen = bs })
	if len(seen) != 1 || seen[0].MaxHold != 7*time.Second || seen[0].Session != "s1" {
		t.Fatalf("WithBudgets: %+v", seen)
	}
	for name, mutate := range map[string]func(s *fsmv1.Snapshot){
		"negative hold budget": func(s *fsmv1.Snapshot) { s.Locks[0].Holders[0].MaxHoldMs = -1 },
		"negative wait budget": func(s *fsmv1.Snapshot) { s.Locks[0].Queue[0].MaxHoldMs = -1 },
		"empty policy":         func(s *fsmv1.Snapshot) { s.Policies[0].DefaultMaxHoldMs = 0 },
		"duplicate policy":     func(s *fsmv1.Snapshot) { s.Policies = append(s.Policies, s.Policies[0]) },
	} {
		s := f.State()
		mutate(s)
		if err := fsm.New(nil).Load(s); err == nil {
			t.Errorf("%s: snapshot loaded", name)
		}
	}
}

func raftLog(term, index uint64, data []byte) *raft.Log {
	return &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: data}
}
