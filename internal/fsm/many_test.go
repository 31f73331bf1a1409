package fsm_test

import (
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

func many(sess string, seq uint64, wait bool, names ...string) *fsmv1.AcquireMany {
	a := &fsmv1.AcquireMany{SessionId: sess, Seq: seq, Wait: wait}
	for _, n := range names {
		a.Locks = append(a.Locks, &fsmv1.ManyLock{Name: n, Mode: excl})
	}
	return a
}

func holderOf(t *testing.T, f *fsm.FSM, name string) string {
	t.Helper()
	l, ok := f.Describe(name)
	if !ok || len(l.Holders) == 0 {
		return ""
	}
	return l.Holders[0].Session
}

// TestAcquireManyAllOrNothing: a free set is granted at once with one token
// per lock in name order; a busy one is refused (BUSY) or queued as one
// request holding nothing, granted only when it can take every lock; a
// single waiter behind a set's wait on a lock is not served first (FIFO),
// while one on a lock the set does not head is.
func TestAcquireManyAllOrNothing(t *testing.T) {
	f := initFSM(t, nil)
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		mustOK(t, f, newSession(id))
	}
	r := mustOK(t, f, many("s1", 1, false, "b", "a"))
	if r.Status != fsm.StatusGranted || len(r.Tokens) != 2 || r.Tokens[0] != epoch+1 || r.Tokens[1] != epoch+2 || holderOf(t, f, "a") != "s1" || holderOf(t, f, "b") != "s1" {
		t.Fatalf("free set: %+v", r)
	}
	// s2 holds c; s3 wants {a, c}: refused without waiting, queued with.
	mustOK(t, f, acq("s2", 1, "c", excl, false))
	if r := apply(t, f, many("s3", 1, false, "a", "c")); r.Code != fsm.CodeBusy {
		t.Fatalf("busy set: %+v", r)
	}
	if r := mustOK(t, f, many("s3", 2, true, "a", "c")); r.Status != fsm.StatusQueued {
		t.Fatalf("queued set: %+v", r)
	}
	// s4 queues for c behind the set.
	mustOK(t, f, acq("s4", 1, "c", excl, true))
	// s1 releases a: the set still cannot take c (s2 holds it): nothing
	// granted, a stays free of holders with the set waiting at its head.
	mustOK(t, f, &fsmv1.Release{SessionId: "s1", Seq: 2, Name: "a", Token: epoch + 1})
	if h := holderOf(t, f, "a"); h != "" {
		t.Fatalf("a granted to %q while the set cannot take c", h)
	}
	// s2 releases c: the set takes a and c at once, before s4.
	mustOK(t, f, &fsmv1.Release{SessionId: "s2", Seq: 2, Name: "c", Token: epoch + 3})
	if holderOf(t, f, "a") != "s3" || holderOf(t, f, "c") != "s3" {
		t.Fatalf("set not granted whole: a=%q c=%q", holderOf(t, f, "a"), holderOf(t, f, "c"))
	}
	if st, _, pos, _ := f.WaitState("s4", "c", 1); st != fsm.StatusQueued || pos != 1 {
		t.Fatalf("s4: status %d position %d", st, pos)
	}
}

// TestAcquireManyDroppedWhole: a cancel naming one lock of a queued set, the
// session's expiry, and a completion of one of its locks each drop the whole
// request from every queue, and the queues move on.
func TestAcquireManyDroppedWhole(t *testing.T) {
	for _, how := range []string{"cancel", "expire", "complete"} {
		t.Run(how, func(t *testing.T) {
			f := initFSM(t, nil)
			for _, id := range []string{"h", "s", "w"} {
				mustOK(t, f, newSession(id))
			}
			tok := mustOK(t, f, acq("h", 1, "b", excl, false)).Token
			mustOK(t, f, many("s", 1, true, "a", "b"))
			mustOK(t, f, acq("w", 1, "a", excl, true)) // behind the set on a
			switch how {
			case "cancel":
				mustOK(t, f, &fsmv1.Cancel{SessionId: "s", Seq: 2, Name: "b", AcquireSeq: 1})
			case "expire":
				mustOK(t, f, &fsmv1.ExpireSession{SessionId: "s"})
			case "complete":
				mustOK(t, f, &fsmv1.Complete{SessionId: "h", Seq: 2, Name: "b", Token: tok, RetentionMs: 1000})
			}
			if holderOf(t, f, "a") != "w" {
				t.Fatalf("a: holder %q, want w once the set left its queue", holderOf(t, f, "a"))
			}
			for _, n := range []string{"a", "b"} {
				if st, _, _, _ := f.WaitState("s", n, 1); st != 0 {
					t.Fatalf("%s: the set still waits or holds (%d)", n, st)
				}
			}
		})
	}
}

// TestAcquireManySnapshot: a queued set survives a snapshot and restore as
// one request; a snapshot with part of a set is refused.
func TestAcquireManySnapshot(t *testing.T) {
	f := initFSM(t, nil)
	for _, id := range []string{"h", "s"} {
		mustOK(t, f, newSession(id))
	}
	tok := mustOK(t, f, acq("h", 1, "b", excl, false)).Token
	mustOK(t, f, many("s", 1, true, "a", "b", "c"))
	g := fsm.New(nil)
	if err := g.RestoreBytes(persist(t, f)); err != nil {
		t.Fatal(err)
	}
	if f.State().String() != g.State().String() {
		t.Fatal("restored state differs")
	}
	mustOK(t, g, &fsmv1.Release{SessionId: "h", Seq: 2, Name: "b", Token: tok})
	for _, n := range []string{"a", "b", "c"} {
		if holderOf(t, g, n) != "s" {
			t.Fatalf("restored set not granted whole: %s held by %q", n, holderOf(t, g, n))
		}
	}
	st := f.State()
	for _, l := range st.Locks {
		if l.Name == "c" {
			l.Queue = nil // part of the set gone
		}
	}
	if err := fsm.New(nil).Load(st); err == nil {
		t.Fatal("a snapshot with part of a set loaded")
	}
}

// TestAcquireManyRefusals: bad sets are refused with CodeInvalid by the
// check the server runs too, a set naming a lock the session holds is
// ALREADY_HELD, and none changes anything.
func TestAcquireManyRefusals(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s"))
	mustOK(t, f, acq("s", 1, "a", excl, false))
	for i, a := range []*fsmv1.AcquireMany{
		many("s", 2, false, "x"),
		many("s", 3, false, "x", "x"),
		many("s", 4, false, "x", ""),
		{SessionId: "s", Seq: 5, Locks: []*fsmv1.ManyLock{{Name: "x", Mode: 7}, {Name: "y", Mode: excl}}},
	} {
		if fsm.ValidateAcquireMany(a) == nil {
			t.Errorf("%d: ValidateAcquireMany passed", i)
		}
		if r := apply(t, f, a); r.Code != fsm.CodeInvalid {
			t.Errorf("%d: %+v", i, r)
		}
	}
	if r := apply(t, f, many("s", 6, true, "a", "b")); r.Code != fsm.CodeAlreadyHeld {
		t.Fatalf("set with a held lock: %+v", r)
	}
	if l, ok := f.Describe("b"); ok {
		t.Fatalf("a refused set left lock b: %+v", l)
	}
}

// BenchmarkApplyAcquireMany: one op is an AcquireMany of three free locks
// (granted at once) and the three Releases (four Apply calls, encoding
// included), and, for the queued case, a set queued behind a holder and
// granted by its release: what a set costs beside single acquires
// (BenchmarkApplyAcquireRelease).
func BenchmarkApplyAcquireMany(b *testing.B) {
	f := initFSM(b, nil)
	mustOK(b, f, newSession("s"))
	mustOK(b, f, newSession("h"))
	b.ReportAllocs()
	seq, hseq := uint64(0), uint64(0)
	for b.Loop() {
		hseq++
		ht := mustOK(b, f, &fsmv1.Acquire{SessionId: "h", Seq: hseq, Ack: hseq, Name: "a", Mode: excl}).Token
		seq++
		a := many("s", seq, true, "a", "b", "c")
		a.Ack = seq
		if r := mustOK(b, f, a); r.Status != fsm.StatusQueued {
			b.Fatalf("set: %+v", r)
		}
		hseq++
		mustOK(b, f, &fsmv1.Release{SessionId: "h", Seq: hseq, Ack: hseq, Name: "a", Token: ht})
		for _, n := range []string{"a", "b", "c"} {
			l, _ := f.Describe(n)
			seq++
			mustOK(b, f, &fsmv1.Release{SessionId: "s", Seq: seq, Ack: seq, Name: n, Token: l.Holders[0].Token})
		}
	}
}
