package fsm_test

import (
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestDeadlockRefused: two sessions each holding one lock and asking for
// the other's: the second wait is refused with CodeDeadlock in the same
// entry, naming both locks and both sessions, and changes nothing; the
// same acquire from an entry written before deadlock detection
// (refuse_deadlock unset) queues, as it always did.
func TestDeadlockRefused(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, newSession("s2"))
	mustOK(t, f, acq("s1", 1, "a", excl, false))
	mustOK(t, f, acq("s2", 1, "b", excl, false))
	w := acq("s1", 2, "b", excl, true)
	w.RefuseDeadlock = true
	if r := mustOK(t, f, w); r.Status != fsm.StatusQueued {
		t.Fatalf("s1 waits for b: %+v", r)
	}
	before := f.State().String()
	c := acq("s2", 2, "a", excl, true)
	c.RefuseDeadlock = true
	r := apply(t, f, c)
	if r.Code != fsm.CodeDeadlock {
		t.Fatalf("closing acquire: %+v", r)
	}
	for _, want := range []string{`"a"`, `"b"`, "s1", "s2"} {
		if !strings.Contains(r.Msg, want) {
			t.Errorf("message %q does not name %s", r.Msg, want)
		}
	}
	// Only the duplicate table moved (the refusal is remembered).
	after := f.State()
	for _, s := range after.Sessions {
		if s.Id == "s2" {
			s.Results = s.Results[:len(s.Results)-1]
		}
	}
	if after.String() != before {
		t.Fatal("the refused acquire changed the lock table")
	}
	old := acq("s2", 3, "a", excl, true) // refuse_deadlock unset: an old entry
	if r := mustOK(t, f, old); r.Status != fsm.StatusQueued {
		t.Fatalf("old entry: %+v, want queued as before", r)
	}
}

// TestDeadlockBeforeGrant: on a full semaphore, x (shared) queues first,
// and x also waits for k, which w holds; w's shared request queued behind x
// is refused at once: when the next slot frees, x gets it (FIFO), and w
// would then wait for x while x waits for w. Counting every earlier request
// makes the cycle visible when w queues, so no grant can close one later.
func TestDeadlockBeforeGrant(t *testing.T) {
	f := initFSM(t, nil)
	for _, id := range []string{"a", "b", "w", "x"} {
		mustOK(t, f, newSession(id))
	}
	tokA := mustOK(t, f, acqLimit("a", 1, "sem", shrd, false, 2)).Token
	mustOK(t, f, acqLimit("b", 1, "sem", shrd, false, 2))
	mustOK(t, f, acq("w", 1, "k", excl, false))
	for i, a := range []*fsmv1.Acquire{acq("x", 1, "k", excl, true), acqLimit("x", 2, "sem", shrd, true, 2)} {
		a.RefuseDeadlock = true
		if r := mustOK(t, f, a); r.Status != fsm.StatusQueued {
			t.Fatalf("x's wait %d: %+v", i, r)
		}
	}
	c := acqLimit("w", 2, "sem", shrd, true, 2)
	c.RefuseDeadlock = true
	r := apply(t, f, c)
	if r.Code != fsm.CodeDeadlock || !strings.Contains(r.Msg, `"sem"`) || !strings.Contains(r.Msg, `"k"`) {
		t.Fatalf("w's acquire behind x: %+v", r)
	}
	// The grant the refusal foresaw: x takes a's slot, and nothing waits in
	// a cycle.
	mustOK(t, f, rel("a", 2, "sem", tokA))
	if l, _ := f.Describe("sem"); len(l.Holders) != 2 || l.Holders[1].Session != "x" || len(l.Waiters) != 0 {
		t.Fatalf("after a's release: %+v", l)
	}
}

// TestDeadlockRefusedSet: a set that would wait for a lock held by a
// session that waits (behind the set's own queued request) for one the
// set's session holds is refused too; nothing of it queues.
func TestDeadlockRefusedSet(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, newSession("s2"))
	mustOK(t, f, acq("s1", 1, "a", excl, false))
	mustOK(t, f, acq("s2", 1, "b", excl, false))
	if r := mustOK(t, f, many("s1", 2, true, "b", "c")); r.Status != fsm.StatusQueued {
		t.Fatalf("s1's set: %+v", r)
	}
	r := apply(t, f, many("s2", 2, true, "a", "c"))
	if r.Code != fsm.CodeDeadlock {
		t.Fatalf("closing set: %+v", r)
	}
	if l, _ := f.Describe("a"); len(l.Waiters) != 0 {
		t.Fatalf("the refused set queued on a: %+v", l.Waiters)
	}
	if l, _ := f.Describe("c"); len(l.Waiters) != 1 {
		t.Fatalf("c: %+v, want s1's set alone", l.Waiters)
	}
}

// TestExplain: the chain follows what each holder waits for, across
// locks, and marks a session seen before as a cycle (here from an old
// entry that did not refuse the closing wait).
func TestExplain(t *testing.T) {
	f := initFSM(t, nil)
	for _, id := range []string{"s1", "s2", "s3"} {
		mustOK(t, f, newSession(id))
	}
	mustOK(t, f, acq("s1", 1, "a", excl, false))
	mustOK(t, f, acq("s2", 1, "b", excl, false))
	mustOK(t, f, acq("s3", 1, "c", excl, false))
	mustOK(t, f, acq("s1", 2, "b", excl, true)) // s1 waits for b (s2)
	mustOK(t, f, acq("s2", 2, "c", excl, true)) // s2 waits for c (s3)
	mustOK(t, f, acq("s3", 2, "a", excl, true)) // old entry: closes the cycle
	_, chain, truncated, ok := f.Explain("a")
	if !ok || truncated || len(chain) != 3 {
		t.Fatalf("chain %+v", chain)
	}
	want := []struct {
		depth         int
		session, lock string
		by            string
		cycle         bool
	}{{1, "s1", "b", "s2", false}, {2, "s2", "c", "s3", false}, {3, "s3", "a", "s1", true}}
	for i, w := range want {
		st := chain[i]
		if st.Depth != w.depth || st.Session != w.session || st.Lock != w.lock || st.BlockedBy != w.by || !st.Holding || st.Cycle != w.cycle {
			t.Errorf("step %d: %+v, want %+v", i, st, w)
		}
	}
	if _, _, _, ok := f.Explain("free"); ok {
		t.Fatal("explain of a lock that does not exist")
	}
}
