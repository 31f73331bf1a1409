package fsm_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

func TestDuplicateRequests(t *testing.T) {
	f := initFSM(t, nil)
	r := mustOK(t, f, newSession("s1"))
	if dup := mustOK(t, f, newSession("s1")); !dup.Duplicate || dup.SessionID != r.SessionID {
		t.Fatalf("repeated create: got %+v, want duplicate of %+v", dup, r)
	}
	mustOK(t, f, newSession("s2"))
	first := mustOK(t, f, acq("s1", 1, "a", excl, false))
	mustOK(t, f, rel("s1", 2, "a", first.Token))
	second := mustOK(t, f, acq("s1", 3, "a", excl, false))
	before := f.State()

	// Each retry answers the first result and changes nothing: a delayed
	// retry of the first release does not free the newer grant.
	for _, c := range []struct {
		m    proto.Message
		want *fsm.Result
	}{
		{acq("s1", 1, "a", excl, false), first},
		{rel("s1", 2, "a", first.Token), &fsm.Result{}},
		{acq("s1", 3, "a", excl, false), second},
	} {
		got := apply(t, f, c.m)
		if !got.Duplicate || got.Code != c.want.Code || got.Token != c.want.Token || got.Status != c.want.Status {
			t.Fatalf("retry of %v: got %+v, want duplicate of %+v", c.m, got, c.want)
		}
		if after := f.State(); !proto.Equal(before, after) {
			t.Fatalf("retry of %v changed the state:\n got %v\nwant %v", c.m, after, before)
		}
	}
	if _, ok := f.CheckToken("a", second.Token); !ok {
		t.Fatalf("newer grant %d lost", second.Token)
	}

	// A refused request is remembered too.
	busy := apply(t, f, acq("s2", 1, "a", excl, false))
	mustOK(t, f, rel("s1", 4, "a", second.Token))
	if got := apply(t, f, acq("s2", 1, "a", excl, false)); got.Code != fsm.CodeBusy || !got.Duplicate {
		t.Fatalf("retry of a refused acquire after the lock was freed: got %+v, want the first answer %+v", got, busy)
	}

	// Once acknowledged, an answer is dropped and a retry is refused.
	mustOK(t, f, &fsmv1.Acquire{SessionId: "s1", Seq: 5, Ack: 5, Name: "b", Mode: excl})
	st := f.State()
	for _, s := range st.Sessions {
		if s.Id == "s1" && (s.Ack != 5 || len(s.Results) != 1 || s.Results[0].Seq != 5) {
			t.Fatalf("s1 after ack 5: got ack %d results %v, want ack 5 and only seq 5", s.Ack, s.Results)
		}
	}
	if got := apply(t, f, acq("s1", 3, "a", excl, false)); got.Code != fsm.CodeInvalid || !strings.Contains(got.Msg, "already answered") {
		t.Fatalf("retry below ack: got code %d (%s), want CodeInvalid", got.Code, got.Msg)
	}
}

// TestDuplicateTableFull checks that a client that never acknowledges cannot
// make the bounded duplicate table forget an answer and apply a retry twice.
func TestDuplicateTableFull(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	first := mustOK(t, f, acq("s1", 1, "a", excl, false))
	mustOK(t, f, rel("s1", 2, "a", first.Token))
	for seq := uint64(3); seq < 1000; seq++ {
		apply(t, f, acq("s1", seq, "x", excl, false)) // alternately granted and already held
	}
	for _, s := range f.State().Sessions {
		if len(s.Results) > 256 {
			t.Fatalf("duplicate table: got %d entries, want at most 256", len(s.Results))
		}
	}
	before := f.State()
	for _, m := range []proto.Message{acq("s1", 1, "a", excl, false), rel("s1", 2, "a", first.Token)} {
		r := apply(t, f, m)
		if r.Code == fsm.OK && !r.Duplicate {
			t.Fatalf("retry of %v after its answer was evicted: got %+v, want a refusal", m, r)
		}
	}
	if after := f.State(); !proto.Equal(before, after) {
		t.Fatalf("evicted retries changed the state")
	}
	if _, ok := f.Describe("a"); ok {
		t.Fatalf("retry of acquire seq 1 granted lock a a second time")
	}
}

// A session waits on "a" (seq 1, still in flight so the client's ack stays 1)
// while it does 256 more requests on other locks. The duplicate table evicts
// seq 1 and raises ack, so the client's re-poll of its live wait is refused
// as invalid, although the wait is still queued and will be granted.
func TestLiveWaitOutlivesDuplicateTable(t *testing.T) {
	f := fsm.New(nil)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	apply(t, f, &fsmv1.CreateSession{SessionId: "h", TtlMs: 10000})
	apply(t, f, &fsmv1.CreateSession{SessionId: "w", TtlMs: 10000})
	r := apply(t, f, &fsmv1.Acquire{SessionId: "h", Seq: 1, Ack: 1, Name: "a", Mode: excl})
	tok := r.Token
	r = apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	if r.Status != fsm.StatusQueued {
		t.Fatalf("want queued, got %+v", r)
	}
	for i := uint64(2); i <= 258; i++ {
		// Other requests, each answered, while ack stays 1 (seq 1 in flight).
		apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: i, Ack: 1, Name: "x", Mode: shrd, Limit: nil})
	}
	r = apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	t.Logf("re-poll of live wait: code=%d msg=%q status=%d", r.Code, r.Msg, r.Status)
	st, _, pos, _ := f.WaitState("w", "a", 1)
	t.Logf("server still has wait: status=%d pos=%d", st, pos)
	apply(t, f, &fsmv1.Release{SessionId: "h", Seq: 2, Ack: 2, Name: "a", Token: tok})
	st, tk, _, _ := f.WaitState("w", "a", 1)
	if r.Code != fsm.OK || r.Status != fsm.StatusQueued {
		t.Fatalf("live wait re-poll: code %d %q status %d, want queued", r.Code, r.Msg, r.Status)
	}
	r = apply(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	if r.Code != fsm.OK || r.Status != fsm.StatusGranted || r.Token != tk || st != fsm.StatusGranted {
		t.Fatalf("re-poll after the grant: %+v, want granted with token %d", r, tk)
	}
}

// A Cancel applied before its Acquire (the acquire still in flight through a
// follower) makes the late Acquire a refused duplicate: it neither queues
// nor takes the lock for a caller that gave up.
func TestCancelOvertakesAcquire(t *testing.T) {
	f := fsm.New(nil)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	apply(t, f, &fsmv1.CreateSession{SessionId: "w", TtlMs: 10000})
	apply(t, f, &fsmv1.Cancel{SessionId: "w", Seq: 2, Ack: 1, Name: "a", AcquireSeq: 1})
	b, err := fsm.Encode(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "w", Seq: 1, Ack: 1, Name: "a", Mode: excl, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	r := f.ApplyCommand(b)
	if r.Code != fsm.CodeCancelled || !r.Duplicate {
		t.Fatalf("late acquire: %+v, want a cancelled duplicate", r)
	}
	if _, ok := f.Describe("a"); ok {
		t.Fatal("late acquire of a cancelled request queued or took the lock")
	}
}

// sessionState returns session id's part of f's state.
func sessionState(t *testing.T, f *fsm.FSM, id string) *fsmv1.Session {
	t.Helper()
	for _, s := range f.State().Sessions {
		if s.Id == id {
			return s
		}
	}
	t.Fatalf("session %s not in the state", id)
	return nil
}

// Cancels that overtake their acquires, from a client that never advances
// its ack: each stores an answer for its acquire as well as its own. The
// table stays within its cap, and every answer stays at or above the floor.
func TestCancelsBeforeAcquiresStayWithinTheCap(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	for seq := uint64(2); seq < 2000; seq += 2 {
		mustOK(t, f, &fsmv1.Cancel{SessionId: "s1", Seq: seq, Ack: 1, Name: "a", AcquireSeq: seq - 1})
	}
	s := sessionState(t, f, "s1")
	if n, limit := len(s.Results), fsm.CurrentCaps().Results; n > limit {
		t.Fatalf("duplicate table: got %d answers, want at most %d", n, limit)
	}
	for _, r := range s.Results {
		if r.Seq < s.Ack {
			t.Fatalf("answer for seq %d below the floor %d", r.Seq, s.Ack)
		}
	}
	// The late acquire of the newest cancel is still refused as cancelled;
	// an old one's is refused as too old. Neither takes the lock.
	if r := apply(t, f, acq("s1", 1997, "a", excl, true)); r.Code != fsm.CodeCancelled || !r.Duplicate {
		t.Fatalf("late acquire of the last cancel: got %+v, want a cancelled duplicate", r)
	}
	if r := apply(t, f, acq("s1", 1, "a", excl, true)); r.Code != fsm.CodeInvalid {
		t.Fatalf("late acquire of the first cancel: got %+v, want CodeInvalid", r)
	}
	if _, ok := f.Describe("a"); ok {
		t.Fatal("a late acquire of a cancelled request queued or took the lock")
	}
}

// A seq reused for another request (a counter bug, a restarted script) is
// refused with CodeInvalid and changes nothing; the first request keeps its
// answer. Before fingerprints, the acquire of b was answered GRANTED with
// a's token while nobody held b, and the release of b was answered OK while
// b stayed held.
func TestReusedSeqAnswersOnlyTheSameRequest(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	ga := mustOK(t, f, acq("s1", 1, "a", excl, false))
	gb := mustOK(t, f, acq("s1", 2, "b", excl, false))
	mustOK(t, f, rel("s1", 3, "a", ga.Token))
	before := f.State()
	for _, m := range []proto.Message{
		acq("s1", 1, "b", excl, false),                                   // another lock
		acq("s1", 1, "a", shrd, false),                                   // another mode
		acqLimit("s1", 1, "a", excl, false, 3),                           // another limit
		rel("s1", 3, "b", gb.Token),                                      // another lock and token
		&fsmv1.Cancel{SessionId: "s1", Seq: 2, Name: "b", AcquireSeq: 2}, // another method
		&fsmv1.Complete{SessionId: "s1", Seq: 2, Name: "b", Token: gb.Token, RetentionMs: 1000},
	} {
		r := apply(t, f, m)
		if r.Code != fsm.CodeInvalid || r.Duplicate || !strings.Contains(r.Msg, "different request") {
			t.Fatalf("%T %v reusing a seq: got %+v, want CodeInvalid", m, m, r)
		}
		if after := f.State(); !proto.Equal(before, after) {
			t.Fatalf("%T %v reusing a seq changed the state", m, m)
		}
	}
	// The same requests are still answered from the table.
	if r := apply(t, f, acq("s1", 1, "a", excl, false)); !r.Duplicate || r.Token != ga.Token {
		t.Fatalf("retry of acquire seq 1: got %+v, want the first answer (token %d)", r, ga.Token)
	}
	if r := apply(t, f, rel("s1", 3, "a", ga.Token)); !r.Duplicate || r.Code != fsm.OK {
		t.Fatalf("retry of release seq 3: got %+v, want the first answer", r)
	}
}

// A seq below the acknowledged floor whose answer is gone is refused, also
// when the session still waits with that seq for the same lock in another
// mode: only the same request is answered from the live wait.
func TestStaleSeqRefused(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("h"))
	mustOK(t, f, newSession("w"))
	mustOK(t, f, acq("h", 1, "a", excl, false))
	mustOK(t, f, acq("w", 1, "a", excl, true))                                          // queued
	mustOK(t, f, &fsmv1.Acquire{SessionId: "w", Seq: 2, Ack: 2, Name: "b", Mode: excl}) // floor 2
	before := f.State()
	for _, m := range []proto.Message{
		acq("w", 1, "a", shrd, true), // same lock, another mode
		acq("w", 1, "c", excl, true), // another lock
		rel("w", 1, "a", 1),
	} {
		if r := apply(t, f, m); r.Code != fsm.CodeInvalid {
			t.Fatalf("%T %v below the floor: got %+v, want CodeInvalid", m, m, r)
		}
		if after := f.State(); !proto.Equal(before, after) {
			t.Fatalf("%T %v below the floor changed the state", m, m)
		}
	}
	if r := apply(t, f, acq("w", 1, "a", excl, true)); r.Code != fsm.OK || r.Status != fsm.StatusQueued {
		t.Fatalf("re-poll of the live wait: got %+v, want queued", r)
	}
}

// Answers in a snapshot written before fingerprints (fingerprint 0) still
// answer their retries, and any repeat of their seq: the FSM cannot tell
// what they answered, and refusing a true retry would fail a client that
// did nothing wrong.
func TestAnswersWithoutFingerprintMatchAnyRepeat(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	ga := mustOK(t, f, acq("s1", 1, "a", excl, false))
	old := f.State()
	for _, s := range old.Sessions {
		for _, r := range s.Results {
			r.Fingerprint = 0
		}
	}
	g := fsm.New(nil)
	if err := g.Load(old); err != nil {
		t.Fatal(err)
	}
	for _, m := range []proto.Message{acq("s1", 1, "a", excl, false), acq("s1", 1, "b", excl, false)} {
		if r := apply(t, g, m); !r.Duplicate || r.Token != ga.Token {
			t.Fatalf("%v against an answer without fingerprint: got %+v, want the stored answer", m, r)
		}
	}
}

// BenchmarkCancelsWithoutAck: a client that never acknowledges, and whose
// cancels overtake their acquires. Each Apply costs the same however long
// the run (the table stays at its cap and no Apply scans it).
func BenchmarkCancelsWithoutAck(b *testing.B) {
	f := initFSM(b, nil)
	mustOK(b, f, newSession("s1"))
	seq := uint64(0)
	for b.Loop() {
		seq += 2
		f.ApplyCommand(cmd(b, &fsmv1.Cancel{SessionId: "s1", Seq: seq, Ack: 1, Name: "a", AcquireSeq: seq - 1}))
	}
}
