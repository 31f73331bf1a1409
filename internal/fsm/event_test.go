package fsm_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// sink records lock events (what the watch sees) and resets as lines.
type sink struct{ lines []string }

func (s *sink) Events(index uint64, evs []fsm.Event) {
	for _, e := range evs {
		if !e.Kind.Watched() {
			continue // session events: not the watch's
		}
		s.lines = append(s.lines, fmt.Sprintf("%d.%d %d %s %s %s %d %d %q", e.Index, e.Num, e.Kind, e.Name, e.Session, e.Owner, e.Token, e.Mode, e.Value))
	}
}

func (s *sink) Reset(from uint64) { s.lines = append(s.lines, fmt.Sprintf("reset %d", from)) }

// logOf applies commands as Raft entries 1, 2, … and returns them.
func logOf(t *testing.T, f *fsm.FSM, cmds ...proto.Message) []*raft.Log {
	t.Helper()
	var logs []*raft.Log
	for i, m := range cmds {
		l := &raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: cmd(t, m)}
		if r, ok := f.Apply(l).(*fsm.Result); !ok || r.Code != fsm.OK {
			t.Fatalf("entry %d %T: %+v", i+1, m, r)
		}
		logs = append(logs, l)
	}
	return logs
}

// Every kind of event comes from the entry that caused it, numbered within
// the entry, with the session's owner; a repeated request (same seq) makes
// no event; replaying the log gives the same events.
func TestEvents(t *testing.T) {
	rec := &sink{}
	f := fsm.New(rec)
	const tok = epoch
	logs := logOf(t, f,
		&fsmv1.Init{ClusterId: "c", Epoch: epoch}, // 1
		newSession("a"), newSession("b"), // 2, 3
		&fsmv1.Acquire{SessionId: "a", Seq: 1, Name: "x", Mode: excl, LockDelayMs: 1000},              // 4
		&fsmv1.Acquire{SessionId: "b", Seq: 1, Name: "x", Mode: excl, Wait: true, Value: []byte("v")}, // 5
		&fsmv1.ExpireSession{SessionId: "a"},                                                          // 6
		&fsmv1.Undelay{Name: "x", Token: tok + 1},                                                     // 7
		&fsmv1.SetValue{SessionId: "b", Seq: 2, Name: "x", Token: tok + 2, Value: []byte("w")},        // 8
		&fsmv1.SetValue{SessionId: "b", Seq: 2, Name: "x", Token: tok + 2, Value: []byte("w")},        // 9: repeat
		&fsmv1.Complete{SessionId: "b", Seq: 3, Name: "x", Token: tok + 2, RetentionMs: 1000},         // 10
		&fsmv1.ClearMark{Name: "x", Token: tok + 2},                                                   // 11
		newSession("c"), newSession("d"), // 12, 13
		acq("c", 1, "y", fsm.ModeShared, false),         // 14
		acqLimit("d", 1, "y", excl, true, 1),            // 15 (limit 1 = the lock's)
		&fsmv1.CloseSession{SessionId: "d"},             // 16
		&fsmv1.RevokeSession{SessionIds: []string{"c"}}, // 17
		&fsmv1.ExpireSession{SessionId: "c"},            // 18
	)
	want := []string{
		fmt.Sprintf(`4.1 1 x a host/a %d 1 ""`, tok+1),
		`5.1 4 x b host/b 0 1 "v"`,
		fmt.Sprintf(`6.1 3 x a host/a %d 1 ""`, tok+1),
		fmt.Sprintf(`6.2 8 x a host/a %d 1 ""`, tok+1),
		fmt.Sprintf(`7.1 9 x   %d 0 ""`, tok+1),
		fmt.Sprintf(`7.2 1 x b host/b %d 1 "v"`, tok+2),
		fmt.Sprintf(`8.1 11 x b host/b %d 1 "w"`, tok+2),
		fmt.Sprintf(`10.1 6 x b host/b %d 1 ""`, tok+2),
		fmt.Sprintf(`11.1 7 x b host/b %d 1 ""`, tok+2),
		fmt.Sprintf(`14.1 1 y c host/c %d 2 ""`, tok+3),
		`15.1 4 y d host/d 0 1 ""`,
		`16.1 5 y d host/d 0 1 ""`,
		fmt.Sprintf(`18.1 10 y c host/c %d 2 ""`, tok+3),
	}
	if !slices.Equal(rec.lines, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", join(rec.lines), join(want))
	}

	// A replica replaying the log hears the same.
	again := &sink{}
	g := fsm.New(again)
	g.ApplyBatch(logs)
	if !slices.Equal(again.lines, want) {
		t.Fatalf("replayed events:\n%s\nwant:\n%s", join(again.lines), join(want))
	}
}

func join(lines []string) string {
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}

// A restored snapshot resets the sink at once (index unknown) and again
// with the index of the next entry, whose events follow.
func TestEventsAfterRestore(t *testing.T) {
	f := fsm.New(nil)
	logOf(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch}, newSession("a"))
	b, err := fsm.EncodeSnapshot(f.State())
	if err != nil {
		t.Fatal(err)
	}
	rec := &sink{}
	g := fsm.New(rec)
	if err := g.RestoreBytes(b); err != nil {
		t.Fatal(err)
	}
	g.Apply(&raft.Log{Index: 7, Type: raft.LogCommand, Data: cmd(t, acq("a", 1, "z", excl, false))})
	want := []string{"reset 0", "reset 7", fmt.Sprintf(`7.1 1 z a host/a %d 1 ""`, epoch+1)}
	if !slices.Equal(rec.lines, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", join(rec.lines), join(want))
	}
}

// SetValue changes only the value of the session's own hold named by its
// token, is answered once per seq, and the value survives a snapshot.
func TestSetValue(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("a"))
	mustOK(t, f, newSession("b"))
	g := mustOK(t, f, acq("a", 1, "x", excl, false))
	for _, tt := range []struct {
		m    *fsmv1.SetValue
		want fsm.Code
	}{
		{&fsmv1.SetValue{SessionId: "b", Seq: 1, Name: "x", Token: g.Token, Value: []byte("b")}, fsm.CodeNotHeld},
		{&fsmv1.SetValue{SessionId: "a", Seq: 2, Name: "x", Token: g.Token + 1, Value: []byte("a")}, fsm.CodeNotHeld},
		{&fsmv1.SetValue{SessionId: "a", Seq: 3, Name: "x", Token: g.Token, Value: make([]byte, fsm.MaxValueBytes+1)}, fsm.CodeInvalid},
		{&fsmv1.SetValue{SessionId: "a", Seq: 4, Name: "x", Token: g.Token, Value: []byte("new")}, fsm.OK},
		// The same seq for another value is another request: refused.
		{&fsmv1.SetValue{SessionId: "a", Seq: 4, Name: "x", Token: g.Token, Value: []byte("other")}, fsm.CodeInvalid},
	} {
		if r := apply(t, f, tt.m); r.Code != tt.want {
			t.Errorf("%v: code %d (%s), want %d", tt.m, r.Code, r.Msg, tt.want)
		}
	}
	if r := apply(t, f, &fsmv1.SetValue{SessionId: "a", Seq: 4, Name: "x", Token: g.Token, Value: []byte("new")}); r.Code != fsm.OK || !r.Duplicate {
		t.Fatalf("repeat: %+v, want OK from the duplicate table", r)
	}
	b, err := fsm.EncodeSnapshot(f.State())
	if err != nil {
		t.Fatal(err)
	}
	g2 := fsm.New(nil)
	if err := g2.RestoreBytes(b); err != nil {
		t.Fatal(err)
	}
	l, ok := g2.Describe("x")
	if !ok || len(l.Holders) != 1 || string(l.Holders[0].Value) != "new" || l.Holders[0].Token != g.Token {
		t.Fatalf("after restore: %+v", l)
	}
}

// An operator's forced expiry (`lockd release --force --unsafe-now`) ends
// the holds as force-released; a lease expiry, even of a revoked session
// in the log before Forced existed, stays as it was.
func TestEventsForcedExpiry(t *testing.T) {
	rec := &sink{}
	f := fsm.New(rec)
	logOf(t, f,
		&fsmv1.Init{ClusterId: "c", Epoch: epoch}, // 1
		newSession("a"), newSession("b"), // 2, 3
		acq("a", 1, "x", excl, false),                      // 4
		acq("b", 1, "y", excl, false),                      // 5
		&fsmv1.ExpireSession{SessionId: "a", Forced: true}, // 6
		&fsmv1.ExpireSession{SessionId: "b", Term: 1},      // 7
	)
	want := []string{
		fmt.Sprintf(`4.1 1 x a host/a %d 1 ""`, epoch+1),
		fmt.Sprintf(`5.1 1 y b host/b %d 1 ""`, epoch+2),
		fmt.Sprintf(`6.1 %d x a host/a %d 1 ""`, fsm.EventForceReleased, epoch+1),
		fmt.Sprintf(`7.1 %d y b host/b %d 1 ""`, fsm.EventExpired, epoch+2),
	}
	if !slices.Equal(rec.lines, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", join(rec.lines), join(want))
	}
}

// A Raft snapshot records its last applied index, so restoring it resets
// the sink at once with the next entry's index (an idle follower's
// watchers must not wait for a write); a backup (State) does not carry it.
func TestEventsAfterSnapshotInstall(t *testing.T) {
	f := fsm.New(nil)
	logOf(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch}, newSession("a"), acq("a", 1, "z", excl, false))
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	store := raft.NewInmemSnapshotStore()
	out, err := store.Create(raft.SnapshotVersionMax, 3, 1, raft.Configuration{}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Persist(out); err != nil {
		t.Fatal(err)
	}
	_, rc, err := store.Open(out.ID())
	if err != nil {
		t.Fatal(err)
	}
	rec := &sink{}
	g := fsm.New(rec)
	if err := g.Restore(rc); err != nil {
		t.Fatal(err)
	}
	if want := []string{"reset 4"}; !slices.Equal(rec.lines, want) {
		t.Fatalf("events after the restore:\n%s\nwant:\n%s", join(rec.lines), join(want))
	}
	g.Apply(&raft.Log{Index: 4, Type: raft.LogCommand, Data: cmd(t, &fsmv1.Release{SessionId: "a", Seq: 2, Name: "z", Token: epoch + 1})})
	want := []string{"reset 4", fmt.Sprintf(`4.1 2 z a host/a %d 1 ""`, epoch+1)}
	if !slices.Equal(rec.lines, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", join(rec.lines), join(want))
	}
	if f.State().AppliedIndex != 0 {
		t.Fatal("State (a backup) carries the applied index")
	}
}

// The one event stream carries everything the leader's timers and the
// blocked Acquire calls need, which a separate Observer used to tell them:
// sessions created (with the TTL), removed and revoked; queue grants and
// dropped waits (with the acquire's seq); completion marks set (with the
// retention) and cleared; lock-delays started (with the delay) and ended;
// and a reset when the state is replaced. Each line below stands for one of
// those; a kind the stream stopped carrying fails the comparison.
func TestEventsCarryTimersAndWaits(t *testing.T) {
	rec := &recorder{}
	f := fsm.New(rec)
	const t1, t2 = epoch + 1, epoch + 2
	logOf(t, f,
		&fsmv1.Init{ClusterId: "c", Epoch: epoch},
		newSession("a"), newSession("b"), newSession("c"),
		&fsmv1.Acquire{SessionId: "a", Seq: 1, Name: "x", Mode: excl, LockDelayMs: 1000},
		&fsmv1.Acquire{SessionId: "b", Seq: 3, Name: "x", Mode: excl, Wait: true},
		&fsmv1.Acquire{SessionId: "c", Seq: 5, Name: "x", Mode: excl, Wait: true},
		&fsmv1.Cancel{SessionId: "c", Seq: 6, Name: "x", AcquireSeq: 5},
		&fsmv1.ExpireSession{SessionId: "a"},
		&fsmv1.Undelay{Name: "x", Token: t1},
		&fsmv1.Acquire{SessionId: "c", Seq: 7, Name: "x", Mode: excl, Wait: true},
		&fsmv1.Complete{SessionId: "b", Seq: 4, Name: "x", Token: t2, RetentionMs: 60000},
		&fsmv1.ClearMark{Name: "x", Token: t2},
		&fsmv1.RevokeSession{SessionIds: []string{"c"}},
		&fsmv1.CloseSession{SessionId: "b"},
	)
	if err := f.RestoreBytes(persist(t, f)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"created a 10000", "created b 10000", "created c 10000",
		fmt.Sprintf(`granted a "x" 1 %d`, t1),
		`dropped c "x" 5`,
		`lockdelay "x" 1000`, "removed a",
		fmt.Sprintf(`undelayed "x" %d`, t1), fmt.Sprintf(`granted b "x" 3 %d`, t2),
		fmt.Sprintf(`marked "x" %d 60000`, t2), `dropped c "x" 7`,
		fmt.Sprintf(`unmarked "x" %d`, t2),
		"revoked c",
		"removed b",
		"restored",
	}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", join(got), join(want))
	}
}
