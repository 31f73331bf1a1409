package fsm_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

const (
	epoch uint64 = 1_700_000_000_000_000 // Unix microseconds, as the leader picks it
	excl         = fsm.ModeExclusive
	shrd         = fsm.ModeShared
)

// fataler is what the helpers need of *testing.T, *testing.F and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// enc encodes a command, failing the test if it cannot.
func enc(tb fataler, typ fsm.CmdType, m proto.Message) []byte {
	tb.Helper()
	b, err := fsm.Encode(typ, m)
	if err != nil {
		tb.Fatalf("encode %T: %v", m, err)
	}
	return b
}

// typeOf returns the command type for a message.
func typeOf(m proto.Message) fsm.CmdType {
	switch m.(type) {
	case *fsmv1.Init:
		return fsm.CmdInit
	case *fsmv1.CreateSession:
		return fsm.CmdCreateSession
	case *fsmv1.CloseSession:
		return fsm.CmdCloseSession
	case *fsmv1.ExpireSession:
		return fsm.CmdExpireSession
	case *fsmv1.RevokeSession:
		return fsm.CmdRevokeSession
	case *fsmv1.Acquire:
		return fsm.CmdAcquire
	case *fsmv1.Release:
		return fsm.CmdRelease
	case *fsmv1.Cancel:
		return fsm.CmdCancel
	case *fsmv1.SetMember:
		return fsm.CmdSetMember
	case *fsmv1.Restore:
		return fsm.CmdRestore
	case *fsmv1.Complete:
		return fsm.CmdComplete
	case *fsmv1.ClearMark:
		return fsm.CmdClearMark
	case *fsmv1.Undelay:
		return fsm.CmdUndelay
	case *fsmv1.SetValue:
		return fsm.CmdSetValue
	case *fsmv1.SetLockPolicy:
		return fsm.CmdSetLockPolicy
	case *fsmv1.EndHold:
		return fsm.CmdEndHold
	case *fsmv1.AcquireMany:
		return fsm.CmdAcquireMany
	case *fsmv1.RequestRelease:
		return fsm.CmdRequestRelease
	case *fsmv1.RevokeHold:
		return fsm.CmdRevokeHold
	}
	panic(fmt.Sprintf("no command type for %T", m))
}

func cmd(tb fataler, m proto.Message) []byte {
	tb.Helper()
	return enc(tb, typeOf(m), m)
}

func apply(tb fataler, f *fsm.FSM, m proto.Message) *fsm.Result {
	tb.Helper()
	return f.ApplyCommand(cmd(tb, m))
}

// mustOK applies m and fails the test unless it succeeds.
func mustOK(tb fataler, f *fsm.FSM, m proto.Message) *fsm.Result {
	tb.Helper()
	r := apply(tb, f, m)
	if r.Code != fsm.OK {
		tb.Fatalf("apply %T %v: got code %d (%s), want OK", m, m, r.Code, r.Msg)
	}
	return r
}

func initFSM(tb fataler, sink fsm.EventSink) *fsm.FSM {
	tb.Helper()
	f := fsm.New(sink)
	mustOK(tb, f, &fsmv1.Init{ClusterId: "c1", Epoch: epoch})
	return f
}

func newSession(id string) *fsmv1.CreateSession {
	return &fsmv1.CreateSession{RequestId: "req-" + id, SessionId: id, TtlMs: 10_000, Owner: "host/" + id}
}

func acq(sess string, seq uint64, name string, mode int32, wait bool) *fsmv1.Acquire {
	return &fsmv1.Acquire{SessionId: sess, Seq: seq, Name: name, Mode: mode, Wait: wait}
}

func acqLimit(sess string, seq uint64, name string, mode int32, wait bool, limit uint32) *fsmv1.Acquire {
	a := acq(sess, seq, name, mode, wait)
	a.Limit = proto.Uint32(limit)
	return a
}

func rel(sess string, seq uint64, name string, token uint64) *fsmv1.Release {
	return &fsmv1.Release{SessionId: sess, Seq: seq, Name: name, Token: token}
}

// recorder is an EventSink that writes as one line each the events the
// leader's timers and the blocked Acquire calls consume: sessions created,
// removed and revoked, grants, dropped waits, marks set and cleared,
// lock-delays started and ended, and resets.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recorder) Events(_ uint64, evs []fsm.Event) {
	for _, e := range evs {
		switch e.Kind {
		case fsm.EventSessionCreated:
			r.add("created %s %d", e.Session, e.DurationMs)
		case fsm.EventSessionRemoved:
			r.add("removed %s", e.Session)
		case fsm.EventSessionRevoked:
			r.add("revoked %s", e.Session)
		case fsm.EventGranted:
			r.add("granted %s %q %d %d", e.Session, e.Name, e.Seq, e.Token)
		case fsm.EventDequeued:
			r.add("dropped %s %q %d", e.Session, e.Name, e.Seq)
		case fsm.EventCompleted:
			r.add("marked %q %d %d", e.Name, e.Token, e.DurationMs)
		case fsm.EventMarkCleared:
			r.add("unmarked %q %d", e.Name, e.Token)
		case fsm.EventDelayStarted:
			r.add("lockdelay %q %d", e.Name, e.DurationMs)
		case fsm.EventDelayEnded:
			r.add("undelayed %q %d", e.Name, e.Token)
		}
	}
}

func (r *recorder) Reset(uint64) { r.add("restored") }

// take returns the events since the last call.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// memSink is an in-memory raft.SnapshotSink.
type memSink struct {
	bytes.Buffer
	closed, cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

// persist snapshots f through the raft.FSM interface and returns the bytes.
func persist(tb fataler, f *fsm.FSM) []byte {
	tb.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		tb.Fatalf("snapshot: %v", err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		tb.Fatalf("persist: %v", err)
	}
	snap.Release()
	if !sink.closed || sink.cancelled {
		tb.Fatalf("sink closed=%v cancelled=%v, want closed", sink.closed, sink.cancelled)
	}
	return sink.Bytes()
}

// grantable reports whether a request of mode fits next to the holders.
func grantable(l *fsmv1.Lock, mode int32) bool {
	if mode == excl {
		return len(l.Holders) == 0
	}
	if len(l.Holders) > 0 && l.Holders[0].Mode == excl {
		return false
	}
	return l.Limit == 0 || uint32(len(l.Holders)) < l.Limit
}

// checkSafety checks what must hold in any state a lock table may be in,
// including one loaded from a snapshot: exclusive holders alone, shared
// holders within the limit, tokens unique and never above the counter.
func checkSafety(snap *fsmv1.Snapshot) error {
	if snap.LastToken < snap.Epoch {
		return fmt.Errorf("last token %d below epoch %d", snap.LastToken, snap.Epoch)
	}
	sessions := map[string]bool{}
	for _, s := range snap.Sessions {
		if sessions[s.Id] {
			return fmt.Errorf("session %q twice", s.Id)
		}
		sessions[s.Id] = true
	}
	tokens := map[uint64]string{}
	for _, l := range snap.Locks {
		seen := map[string]bool{}
		for i, h := range l.Holders {
			switch {
			case h.Mode != excl && h.Mode != shrd:
				return fmt.Errorf("lock %q: holder %s has mode %d", l.Name, h.SessionId, h.Mode)
			case h.Mode == excl && len(l.Holders) > 1:
				return fmt.Errorf("lock %q: exclusive holder %s not alone: %v", l.Name, h.SessionId, l.Holders)
			case h.Mode != l.Holders[0].Mode:
				return fmt.Errorf("lock %q: holders of both kinds: %v", l.Name, l.Holders)
			case h.Token == 0 || h.Token > snap.LastToken:
				return fmt.Errorf("lock %q: token %d outside (0, last token %d]", l.Name, h.Token, snap.LastToken)
			case tokens[h.Token] != "":
				return fmt.Errorf("lock %q: token %d also held on %q", l.Name, h.Token, tokens[h.Token])
			case i > 0 && h.Token <= l.Holders[i-1].Token:
				return fmt.Errorf("lock %q: holders not in token order: %v", l.Name, l.Holders)
			case !sessions[h.SessionId]:
				return fmt.Errorf("lock %q: holder session %q does not exist", l.Name, h.SessionId)
			case seen[h.SessionId]:
				return fmt.Errorf("lock %q: session %q holds twice", l.Name, h.SessionId)
			}
			tokens[h.Token] = l.Name
			seen[h.SessionId] = true
		}
		if l.Limit > 0 && len(l.Holders) > int(l.Limit) {
			return fmt.Errorf("lock %q: %d holders, limit %d", l.Name, len(l.Holders), l.Limit)
		}
		for _, w := range l.Queue {
			switch {
			case w.Mode != excl && w.Mode != shrd:
				return fmt.Errorf("lock %q: waiter %s has mode %d", l.Name, w.SessionId, w.Mode)
			case !sessions[w.SessionId]:
				return fmt.Errorf("lock %q: waiter session %q does not exist", l.Name, w.SessionId)
			case seen[w.SessionId]:
				return fmt.Errorf("lock %q: session %q holds or waits twice", l.Name, w.SessionId)
			}
			seen[w.SessionId] = true
		}
	}
	return nil
}

// checkInvariants checks checkSafety plus what Apply keeps true: no empty
// lock is kept, and no queue head could be granted (nothing waits for a
// lock that is free for it).
func checkInvariants(snap *fsmv1.Snapshot) error {
	if err := checkSafety(snap); err != nil {
		return err
	}
	for _, l := range snap.Locks {
		if l.Mark != nil && (len(l.Holders) > 0 || len(l.Queue) > 0) {
			return fmt.Errorf("lock %q has a completion mark and holders or waiters", l.Name)
		}
		if len(l.Holders) == 0 && len(l.Queue) == 0 && l.Mark == nil && !l.Delayed {
			return fmt.Errorf("lock %q kept with no holders, waiters or mark", l.Name)
		}
		for _, w := range l.Queue {
			if w.SetSize > 0 {
				if err := checkSet(snap, w); err != nil {
					return fmt.Errorf("lock %q: %w", l.Name, err)
				}
			}
		}
		if len(l.Queue) > 0 && l.Queue[0].SetSize > 0 {
			continue // checked as a set
		}
		if !l.Delayed && len(l.Queue) > 0 && grantable(l, l.Queue[0].Mode) {
			return fmt.Errorf("lock %q: queue head %s (mode %d) is grantable but waits; holders %v", l.Name, l.Queue[0].SessionId, l.Queue[0].Mode, l.Holders)
		}
	}
	return nil
}

// withoutResult returns a copy of snap without the duplicate-table entry of
// (session, seq): what a refused request may add.
func withoutResult(snap *fsmv1.Snapshot, session string, seq uint64) *fsmv1.Snapshot {
	snap = proto.CloneOf(snap)
	for _, s := range snap.Sessions {
		if s.Id == session {
			s.Results = slices.DeleteFunc(s.Results, func(r *fsmv1.Result) bool { return r.Seq == seq })
		}
	}
	return snap
}

func TestInitAndTokens(t *testing.T) {
	f := initFSM(t, nil)
	// A second Init (a racing new leader) changes nothing.
	mustOK(t, f, &fsmv1.Init{ClusterId: "other", Epoch: epoch * 2})
	info := f.Info()
	if info.ClusterID != "c1" || info.Epoch != epoch || info.LastToken != epoch {
		t.Fatalf("info: got %+v, want cluster c1, epoch and last token %d", info, uint64(epoch))
	}
	mustOK(t, f, newSession("s1"))
	var last uint64
	for i := range 5 {
		seq := uint64(2*i + 1)
		r := mustOK(t, f, acq("s1", seq, "a", excl, false))
		if r.Status != fsm.StatusGranted {
			t.Fatalf("acquire %d: got status %d, want granted", i, r.Status)
		}
		want := epoch + uint64(i) + 1
		if r.Token != want {
			t.Fatalf("acquire %d: got token %d, want %d (epoch + grant count)", i, r.Token, want)
		}
		if r.Token <= last {
			t.Fatalf("acquire %d: token %d not above previous %d", i, r.Token, last)
		}
		last = r.Token
		mustOK(t, f, rel("s1", seq+1, "a", r.Token))
	}
	if _, ok := f.Describe("a"); ok {
		t.Fatalf("lock a still exists after its last release")
	}
}

func TestExclusiveQueueFIFO(t *testing.T) {
	rec := &recorder{}
	f := initFSM(t, rec)
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		mustOK(t, f, newSession(id))
	}
	rec.take()
	tok := mustOK(t, f, acq("s1", 1, "job", excl, true)).Token

	busy := apply(t, f, acq("s2", 1, "job", excl, false))
	if busy.Code != fsm.CodeBusy || len(busy.Holders) != 1 || busy.Holders[0].Session != "s1" || busy.Holders[0].Token != tok || busy.Holders[0].Owner != "host/s1" {
		t.Fatalf("try-acquire of a held lock: got %+v, want CodeBusy naming holder s1 with token %d", busy, tok)
	}
	for i, id := range []string{"s2", "s3", "s4"} {
		r := mustOK(t, f, acq(id, 2, "job", excl, true))
		if r.Status != fsm.StatusQueued || r.Position != uint32(i+1) {
			t.Fatalf("%s: got status %d position %d, want queued at %d", id, r.Status, r.Position, i+1)
		}
	}
	li, _ := f.Describe("job")
	var order []string
	for _, w := range li.Waiters {
		order = append(order, w.Session)
	}
	if got, want := strings.Join(order, ","), "s2,s3,s4"; got != want {
		t.Fatalf("queue: got %s, want %s", got, want)
	}
	if st, _, pos, _ := f.WaitState("s3", "job", 2); st != fsm.StatusQueued || pos != 2 {
		t.Fatalf("WaitState(s3): got status %d position %d, want queued at 2", st, pos)
	}

	// Each release hands over to exactly the next waiter, in the same entry.
	rec.take()
	holder, seq := "s1", uint64(1)
	for _, next := range []string{"s2", "s3", "s4"} {
		before := f.Info().Stats.QueueGrants
		mustOK(t, f, rel(holder, seq+10, "job", tok))
		if got := f.Info().Stats.QueueGrants - before; got != 1 {
			t.Fatalf("release by %s: got %d queue grants, want 1", holder, got)
		}
		st, newTok, _, _ := f.WaitState(next, "job", 2)
		if st != fsm.StatusGranted || newTok != tok+1 {
			t.Fatalf("after release by %s: %s got status %d token %d, want granted with %d", holder, next, st, newTok, tok+1)
		}
		if got, want := rec.take(), []string{fmt.Sprintf("granted %s \"job\" 2 %d", next, newTok)}; !slices.Equal(got, want) {
			t.Fatalf("events: got %q, want %q", got, want)
		}
		if _, ok := f.CheckToken("job", tok); ok {
			t.Fatalf("old token %d still valid after release", tok)
		}
		if h, ok := f.CheckToken("job", newTok); !ok || h.Session != next {
			t.Fatalf("CheckToken(%d): got %+v %v, want held by %s", newTok, h, ok, next)
		}
		holder, seq, tok = next, 2, newTok
	}
}

func TestSemaphore(t *testing.T) {
	f := initFSM(t, nil)
	for _, id := range []string{"s1", "s2", "s3"} {
		mustOK(t, f, newSession(id))
	}
	t1 := mustOK(t, f, acqLimit("s1", 1, "sem", shrd, false, 2)).Token
	mustOK(t, f, acq("s2", 1, "sem", shrd, false)) // limit absent: the lock's applies
	if r := apply(t, f, acq("s3", 1, "sem", shrd, false)); r.Code != fsm.CodeBusy {
		t.Fatalf("third permit of 2: got code %d (%s), want CodeBusy", r.Code, r.Msg)
	}
	if r := mustOK(t, f, acqLimit("s3", 2, "sem", shrd, true, 2)); r.Status != fsm.StatusQueued {
		t.Fatalf("third permit, wait: got status %d, want queued", r.Status)
	}
	mustOK(t, f, rel("s1", 2, "sem", t1))
	if st, _, _, _ := f.WaitState("s3", "sem", 2); st != fsm.StatusGranted {
		t.Fatalf("s3 after a permit was released: got status %d, want granted", st)
	}
	if li, _ := f.Describe("sem"); len(li.Holders) != 2 || li.Limit != 2 {
		t.Fatalf("describe: got %+v, want 2 holders, limit 2", li)
	}
}

func TestReadWriteLockWriterPreference(t *testing.T) {
	rec := &recorder{}
	f := initFSM(t, rec)
	for _, id := range []string{"r1", "r2", "w", "r3", "r4"} {
		mustOK(t, f, newSession(id))
	}
	rec.take()
	r1 := mustOK(t, f, acqLimit("r1", 1, "rw", shrd, false, 0)).Token
	r2 := mustOK(t, f, acq("r2", 1, "rw", shrd, false)).Token
	if r := mustOK(t, f, acq("w", 1, "rw", excl, true)); r.Status != fsm.StatusQueued {
		t.Fatalf("writer behind readers: got status %d, want queued", r.Status)
	}
	// A reader behind a waiting writer queues even though readers hold.
	if r := apply(t, f, acq("r3", 1, "rw", shrd, false)); r.Code != fsm.CodeBusy || !strings.Contains(r.Msg, "busy") {
		t.Fatalf("try-read behind a waiting writer: got code %d (%s), want CodeBusy", r.Code, r.Msg)
	}
	mustOK(t, f, acq("r3", 2, "rw", shrd, true))
	mustOK(t, f, acq("r4", 1, "rw", shrd, true))
	rec.take()
	mustOK(t, f, rel("r1", 2, "rw", r1))
	if ev := rec.take(); len(ev) != 0 {
		t.Fatalf("release of one of two readers: got events %q, want none", ev)
	}
	mustOK(t, f, rel("r2", 2, "rw", r2))
	st, wt, _, _ := f.WaitState("w", "rw", 1)
	if st != fsm.StatusGranted {
		t.Fatalf("writer after readers left: got status %d, want granted", st)
	}
	rec.take()
	mustOK(t, f, rel("w", 2, "rw", wt))
	// Both readers queued behind the writer are granted together, in order.
	want := []string{
		fmt.Sprintf("granted r3 \"rw\" 2 %d", wt+1),
		fmt.Sprintf("granted r4 \"rw\" 1 %d", wt+2),
	}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("events: got %q, want %q", got, want)
	}
}

func TestCancel(t *testing.T) {
	rec := &recorder{}
	f := initFSM(t, rec)
	for _, id := range []string{"s1", "s2", "s3"} {
		mustOK(t, f, newSession(id))
	}
	tok := mustOK(t, f, acq("s1", 1, "a", excl, false)).Token
	mustOK(t, f, acq("s2", 1, "a", excl, true))
	mustOK(t, f, acq("s3", 1, "a", excl, true))
	rec.take()

	// Cancel naming another acquire changes nothing.
	if r := mustOK(t, f, &fsmv1.Cancel{SessionId: "s2", Seq: 2, Name: "a", AcquireSeq: 7}); r.Released {
		t.Fatalf("cancel of an unknown acquire: got released, want nothing")
	}
	mustOK(t, f, &fsmv1.Cancel{SessionId: "s2", Seq: 3, Name: "a", AcquireSeq: 1})
	if got, want := rec.take(), []string{`dropped s2 "a" 1`}; !slices.Equal(got, want) {
		t.Fatalf("events: got %q, want %q", got, want)
	}
	mustOK(t, f, rel("s1", 2, "a", tok))
	st, t3, _, _ := f.WaitState("s3", "a", 1)
	if st != fsm.StatusGranted || t3 != tok+1 {
		t.Fatalf("s3: got status %d token %d, want granted with %d (s2 cancelled)", st, t3, tok+1)
	}
	// A cancel that raced with the grant releases it.
	if r := mustOK(t, f, &fsmv1.Cancel{SessionId: "s3", Seq: 2, Name: "a", AcquireSeq: 1}); !r.Released {
		t.Fatalf("cancel of a granted acquire: got %+v, want released", r)
	}
	if _, ok := f.Describe("a"); ok {
		t.Fatalf("lock a exists after its only holder cancelled")
	}
}

func TestExpireReleasesAndHandsOverInOneEntry(t *testing.T) {
	rec := &recorder{}
	f := initFSM(t, rec)
	for _, id := range []string{"s1", "s2", "s3"} {
		mustOK(t, f, newSession(id))
	}
	mustOK(t, f, acq("s1", 1, "b", excl, false))
	mustOK(t, f, acq("s1", 2, "a", excl, false))
	mustOK(t, f, acq("s2", 1, "b", excl, true))
	mustOK(t, f, acq("s2", 2, "a", excl, true))
	mustOK(t, f, acq("s3", 1, "a", excl, true))
	mustOK(t, f, acq("s2", 3, "c", excl, false))
	mustOK(t, f, acq("s1", 3, "c", excl, true))
	// s2 holds c and waits on a and b; s1 holds a and b and waits on c.
	tokC, _ := f.CheckToken("c", epoch+3)
	if tokC.Session != "s2" {
		t.Fatalf("c: got holder %+v, want s2", tokC)
	}
	rec.take()
	before := f.Info().LastToken
	mustOK(t, f, &fsmv1.ExpireSession{SessionId: "s1", TimeUnixNano: 42})
	want := []string{
		`dropped s1 "c" 3`,
		fmt.Sprintf("granted s2 \"a\" 2 %d", before+1),
		fmt.Sprintf("granted s2 \"b\" 1 %d", before+2),
		"removed s1",
	}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("events: got %q, want %q", got, want)
	}
	if _, ok := f.Session("s1"); ok {
		t.Fatalf("session s1 still exists after expiry")
	}
	li, _ := f.Describe("a")
	if len(li.Holders) != 1 || !li.Holders[0].GrantedAt.Equal(time.Unix(0, 42)) || len(li.Waiters) != 1 || li.Waiters[0].Session != "s3" {
		t.Fatalf("a after expiry: got %+v, want held by s2 (granted at 42), s3 waiting", li)
	}
	if got := f.Info().Stats.Expired; got != 1 {
		t.Fatalf("expired stat: got %d, want 1", got)
	}
	// Close drops the same way; unknown sessions are a no-op.
	mustOK(t, f, &fsmv1.CloseSession{SessionId: "s2", Seq: 9})
	mustOK(t, f, &fsmv1.CloseSession{SessionId: "nobody"})
	mustOK(t, f, &fsmv1.ExpireSession{SessionId: "nobody"})
	if st, _, _, _ := f.WaitState("s3", "a", 1); st != fsm.StatusGranted {
		t.Fatalf("s3 after s2 closed: got status %d, want granted", st)
	}
	if got := f.Sessions(); len(got) != 1 || got[0].ID != "s3" || got[0].Holds != 1 || got[0].Waits != 0 {
		t.Fatalf("sessions: got %+v, want only s3 with one hold", got)
	}
}

// c returns the encoding of m as a table-test data function.
func c(m proto.Message) func(*testing.T) []byte {
	return func(t *testing.T) []byte { return cmd(t, m) }
}

func bs(b ...byte) func(*testing.T) []byte {
	return func(*testing.T) []byte { return b }
}

// requestOf returns the (session, seq) of a session request command: the
// key of its duplicate-table entry.
func requestOf(data []byte) (string, uint64, bool) {
	_, m, err := fsm.Decode(data)
	if err != nil {
		return "", 0, false
	}
	switch m := m.(type) {
	case *fsmv1.Acquire:
		return m.SessionId, m.Seq, true
	case *fsmv1.Release:
		return m.SessionId, m.Seq, true
	case *fsmv1.Cancel:
		return m.SessionId, m.Seq, true
	case *fsmv1.AcquireMany:
		return m.SessionId, m.Seq, true
	}
	return "", 0, false
}

// rawCmd builds a command field by field, bypassing Encode (which refuses
// invalid UTF-8).
func rawCmd(t fsm.CmdType, fields ...rawField) []byte {
	b := []byte{byte(t)}
	for _, f := range fields {
		switch v := f.v.(type) {
		case string:
			b = protowire.AppendTag(b, f.num, protowire.BytesType)
			b = protowire.AppendString(b, v)
		case uint64:
			b = protowire.AppendTag(b, f.num, protowire.VarintType)
			b = protowire.AppendVarint(b, v)
		}
	}
	return b
}

type rawField struct {
	num protowire.Number
	v   any
}

func TestBadInput(t *testing.T) {
	// base: s1 holds "held" (exclusive) and "sem" (shared, limit 3); s2 waits
	// for "held"; s3 is revoked.
	base := func(t *testing.T) *fsm.FSM {
		f := initFSM(t, nil)
		for _, id := range []string{"s1", "s2", "s3"} {
			mustOK(t, f, newSession(id))
		}
		mustOK(t, f, acq("s1", 1, "held", excl, false))
		mustOK(t, f, acq("s2", 1, "held", excl, true))
		mustOK(t, f, acqLimit("s1", 2, "sem", shrd, false, 3))
		mustOK(t, f, &fsmv1.RevokeSession{SessionIds: []string{"s3", "nobody"}})
		return f
	}
	held := uint64(epoch + 1)
	value := func(n int) *fsmv1.Acquire {
		a := acq("s1", 10, "v", excl, false)
		a.Value = bytes.Repeat([]byte{'v'}, n)
		return a
	}
	tests := []struct {
		name  string
		fresh bool // apply to an FSM without Init
		data  func(t *testing.T) []byte
		code  fsm.Code
		msg   string
	}{
		{name: "empty name", data: c(acq("s1", 10, "", excl, false)), code: fsm.CodeInvalid, msg: "lock name is empty"},
		{name: "oversized name", data: c(acq("s1", 10, strings.Repeat("n", 513), excl, false)), code: fsm.CodeInvalid, msg: "lock name is 513 bytes, more than 512"},
		{name: "NUL in name", data: c(acq("s1", 10, "a\x00b", excl, false)), code: fsm.CodeInvalid, msg: "control character U+0000"},
		{name: "newline in name", data: c(acq("s1", 10, "a\nb", excl, false)), code: fsm.CodeInvalid, msg: "control character U+000A"},
		{name: "C1 control in name", data: c(acq("s1", 10, "a\u0085b", excl, false)), code: fsm.CodeInvalid, msg: "control character U+0085"},
		{name: "DEL in name", data: c(acq("s1", 10, "a\x7fb", excl, false)), code: fsm.CodeInvalid, msg: "control character U+007F"},
		{name: "invalid UTF-8 name", data: func(*testing.T) []byte {
			return rawCmd(fsm.CmdAcquire, rawField{1, "s1"}, rawField{2, uint64(10)}, rawField{4, "a\xffb"}, rawField{5, uint64(excl)})
		}, code: fsm.CodeInvalid, msg: "invalid UTF-8"},
		{name: "oversized value", data: c(value(1025)), code: fsm.CodeInvalid, msg: "value is 1025 bytes, more than 1024"},
		{name: "mode 0", data: c(acq("s1", 10, "m", 0, false)), code: fsm.CodeInvalid, msg: "unknown mode 0"},
		{name: "mode 3", data: c(acq("s1", 10, "m", 3, false)), code: fsm.CodeInvalid, msg: "unknown mode 3"},
		{name: "oversized owner", data: c(&fsmv1.CreateSession{SessionId: "s9", TtlMs: 1000, Owner: strings.Repeat("o", 257)}), code: fsm.CodeInvalid, msg: "owner longer than 256 bytes"},
		{name: "empty session id", data: c(&fsmv1.CreateSession{TtlMs: 1000}), code: fsm.CodeInvalid, msg: "bad session id"},
		{name: "oversized session id", data: c(&fsmv1.CreateSession{SessionId: strings.Repeat("s", 65), TtlMs: 1000}), code: fsm.CodeInvalid, msg: "bad session id"},
		{name: "oversized request id", data: c(&fsmv1.CreateSession{SessionId: "s9", RequestId: strings.Repeat("r", 65), TtlMs: 1000}), code: fsm.CodeInvalid, msg: "request id longer than 64 bytes"},
		{name: "zero ttl", data: c(&fsmv1.CreateSession{SessionId: "s9"}), code: fsm.CodeInvalid, msg: "ttl must be positive"},
		{name: "negative ttl", data: c(&fsmv1.CreateSession{SessionId: "s9", TtlMs: -5}), code: fsm.CodeInvalid, msg: "ttl must be positive"},
		{name: "existing session id", data: c(&fsmv1.CreateSession{SessionId: "s1", RequestId: "other", TtlMs: 1000}), code: fsm.CodeInvalid, msg: "session id s1 already exists"},
		{name: "unknown session acquire", data: c(acq("nobody", 1, "a", excl, false)), code: fsm.CodeSessionUnknown, msg: "session nobody not found"},
		{name: "unknown session release", data: c(rel("nobody", 1, "held", held)), code: fsm.CodeSessionUnknown, msg: "session nobody not found"},
		{name: "unknown session cancel", data: c(&fsmv1.Cancel{SessionId: "nobody", Seq: 1, Name: "held", AcquireSeq: 1}), code: fsm.CodeSessionUnknown, msg: "session nobody not found"},
		{name: "seq 0 acquire", data: c(acq("s1", 0, "a", excl, false)), code: fsm.CodeInvalid, msg: "seq must be positive"},
		{name: "seq 0 release", data: c(rel("s1", 0, "held", held)), code: fsm.CodeInvalid, msg: "seq must be positive"},
		{name: "seq 0 cancel", data: c(&fsmv1.Cancel{SessionId: "s2", Name: "held", AcquireSeq: 1}), code: fsm.CodeInvalid, msg: "seq must be positive"},
		{name: "release by non-holder", data: c(rel("s2", 10, "held", held)), code: fsm.CodeNotHeld, msg: `lock "held" is not held with token 1700000000000001 by this session`},
		{name: "release with wrong token", data: c(rel("s1", 10, "held", held+1)), code: fsm.CodeNotHeld, msg: `lock "held" is not held with token 1700000000000002`},
		{name: "release of a lock that does not exist", data: c(rel("s1", 10, "nothing", held)), code: fsm.CodeNotHeld, msg: `lock "nothing" is not held`},
		{name: "release with empty name", data: c(rel("s1", 10, "", held)), code: fsm.CodeNotHeld, msg: `lock "" is not held`},
		{name: "limit mismatch", data: c(acqLimit("s2", 10, "sem", shrd, true, 2)), code: fsm.CodeLimitMismatch, msg: `lock "sem" has limit 3, request asked 2`},
		{name: "limit mismatch exclusive", data: c(acqLimit("s2", 10, "sem", excl, true, 0)), code: fsm.CodeLimitMismatch, msg: `lock "sem" has limit 3, request asked 0`},
		{name: "acquire of a held lock", data: c(acq("s1", 10, "held", excl, true)), code: fsm.CodeAlreadyHeld, msg: `session already holds "held"`},
		{name: "shared acquire of a held lock", data: c(acq("s1", 10, "sem", shrd, false)), code: fsm.CodeAlreadyHeld, msg: `session already holds "sem"`},
		{name: "acquire of a waited lock", data: c(acq("s2", 10, "held", excl, true)), code: fsm.CodeAlreadyHeld, msg: `session already waits for "held"`},
		{name: "revoked session", data: c(acq("s3", 10, "free", excl, false)), code: fsm.CodeRevoked, msg: "session s3 was force-released"},
		{name: "revoked session, held lock", data: c(acq("s3", 10, "held", excl, true)), code: fsm.CodeRevoked, msg: "session s3 was force-released"},
		{name: "try-acquire of a held lock", data: c(acq("s2", 10, "sem", excl, false)), code: fsm.CodeBusy, msg: `lock "sem" is busy`},
		{name: "not initialized", fresh: true, data: c(newSession("s1")), code: fsm.CodeNotInitialized, msg: "cluster not initialized"},
		{name: "init without cluster id", fresh: true, data: c(&fsmv1.Init{Epoch: 5}), code: fsm.CodeInvalid, msg: "init without cluster id"},
		{name: "init epoch too large", fresh: true, data: c(&fsmv1.Init{ClusterId: "c", Epoch: 1 << 62}), code: fsm.CodeInvalid, msg: "init epoch 4611686018427387904 is not below"},
		{name: "init epoch max", fresh: true, data: c(&fsmv1.Init{ClusterId: "c", Epoch: ^uint64(0)}), code: fsm.CodeInvalid, msg: "is not below"},
		{name: "member without id", data: c(&fsmv1.SetMember{ApiUrl: "http://x"}), code: fsm.CodeInvalid, msg: "bad member"},
		{name: "oversized member id", data: c(&fsmv1.SetMember{NodeId: strings.Repeat("n", 65)}), code: fsm.CodeInvalid, msg: "bad member"},
		{name: "empty command", data: bs(), code: fsm.CodeInvalid, msg: "empty command"},
		{name: "command type 0", data: bs(0), code: fsm.CodeInvalid, msg: "unknown command type 0"},
		{name: "command type 99", data: bs(99, 0x0a, 0x01, 'x'), code: fsm.CodeInvalid, msg: "unknown command type 99"},
		{name: "command type 255", data: bs(255), code: fsm.CodeInvalid, msg: "unknown command type 255"},
		{name: "garbage acquire", data: bs(byte(fsm.CmdAcquire), 0xff, 0xff, 0xff), code: fsm.CodeInvalid, msg: "decode command type 6"},
		{name: "truncated release", data: bs(byte(fsm.CmdRelease), 0x0a, 0x05, 's'), code: fsm.CodeInvalid, msg: "decode command type 7"},
		{name: "wrong wire type", data: bs(byte(fsm.CmdCreateSession), 0x0b), code: fsm.CodeInvalid, msg: "decode command type 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f *fsm.FSM
			if tt.fresh {
				f = fsm.New(nil)
			} else {
				f = base(t)
			}
			before := f.State()
			r := f.ApplyCommand(tt.data(t))
			if r.Code != tt.code || !strings.Contains(r.Msg, tt.msg) {
				t.Fatalf("got code %d %q, want code %d containing %q", r.Code, r.Msg, tt.code, tt.msg)
			}
			if r.Msg == "" || r.Token != 0 || r.Status != 0 || r.SessionID != "" {
				t.Fatalf("refusal %+v: want a message and no grant", r)
			}
			var e *fsm.Error
			if err := r.Err(); !errors.As(err, &e) || e.Code != tt.code || err.Error() != r.Msg {
				t.Fatalf("Err(): got %v, want *fsm.Error with code %d", err, tt.code)
			}
			// Nothing changes but the refusal recorded for retries.
			after := f.State()
			if session, seq, ok := requestOf(tt.data(t)); ok {
				after = withoutResult(after, session, seq)
			}
			if !proto.Equal(before, after) {
				t.Fatalf("refused command changed the state:\n got %v\nwant %v", after, before)
			}
			if err := checkInvariants(after); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestReads(t *testing.T) {
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, newSession("s2"))
	for i, name := range []string{"jobs/b", "jobs/a", "jobs/c", "other"} {
		mustOK(t, f, acq("s1", uint64(i+1), name, excl, false))
	}
	mustOK(t, f, acq("s2", 1, "jobs/a", excl, true))
	page, more := f.List("jobs/", "", 2)
	if len(page) != 2 || page[0].Name != "jobs/a" || page[1].Name != "jobs/b" || !more {
		t.Fatalf("List page 1: got %+v more=%v, want jobs/a, jobs/b and more", page, more)
	}
	if len(page[0].Waiters) != 1 || page[0].Waiters[0].Session != "s2" || page[0].Waiters[0].Owner != "host/s2" {
		t.Fatalf("jobs/a waiters: got %+v, want s2", page[0].Waiters)
	}
	page, more = f.List("jobs/", "jobs/b", 2)
	if len(page) != 1 || page[0].Name != "jobs/c" || more {
		t.Fatalf("List page 2: got %+v more=%v, want jobs/c and no more", page, more)
	}
	if _, ok := f.CheckToken("nothing", epoch+1); ok {
		t.Fatalf("CheckToken of a missing lock: got true")
	}
	if _, ok := f.CheckToken("jobs/b", epoch+2); ok {
		t.Fatalf("CheckToken with another lock's token: got true")
	}
	if st, _, _, _ := f.WaitState("nobody", "jobs/a", 1); st != 0 {
		t.Fatalf("WaitState of an unknown session: got %d, want 0", st)
	}
	if s, ok := f.Session("s1"); !ok || s.Holds != 4 || s.Owner != "host/s1" || s.TTL != 10*time.Second {
		t.Fatalf("Session(s1): got %+v %v", s, ok)
	}
	if info := f.Info(); info.Sessions != 2 || info.Locks != 4 || info.Stats.Grants != 4 {
		t.Fatalf("Info: got %+v, want 2 sessions, 4 locks, 4 grants", info)
	}
}

// Apply answers with what the server's metrics and handlers need, so they
// read nothing around the proposal: a session's TTL (the found session's on
// a repeat), when a waiting request was queued, whether a lock-delay runs,
// and when an ended hold was granted; a repeat ends no hold.
func TestResultFacts(t *testing.T) {
	f := initFSM(t, nil)
	c := newSession("a")
	c.TimeUnixNano = 5
	if r := mustOK(t, f, c); r.TTL != 10*time.Second || r.Duplicate {
		t.Fatalf("create: got %+v, want TTL 10s", r)
	}
	c.TtlMs = 99
	if r := mustOK(t, f, c); r.TTL != 10*time.Second || !r.Duplicate || r.Secretless != true {
		t.Fatalf("repeated create: got %+v, want the found session's TTL 10s, secretless", r)
	}
	mustOK(t, f, newSession("b"))
	mustOK(t, f, newSession("c"))
	a := &fsmv1.Acquire{SessionId: "a", Seq: 1, Name: "x", Mode: excl, LockDelayMs: 1000, TimeUnixNano: 10}
	if r := mustOK(t, f, a); !r.QueuedAt.IsZero() || r.Delayed {
		t.Fatalf("grant: got %+v, want no queue time, no delay", r)
	}
	b := &fsmv1.Acquire{SessionId: "b", Seq: 1, Name: "x", Mode: excl, Wait: true, TimeUnixNano: 20}
	if r := mustOK(t, f, b); !r.QueuedAt.Equal(time.Unix(0, 20)) || r.Delayed {
		t.Fatalf("queued: got %+v, want queued at 20", r)
	}
	b.TimeUnixNano = 30
	if r := mustOK(t, f, b); !r.QueuedAt.Equal(time.Unix(0, 20)) || !r.Duplicate {
		t.Fatalf("repeated while queued: got %+v, want the first queue time 20", r)
	}
	rel := &fsmv1.Release{SessionId: "a", Seq: 2, Name: "x", Token: epoch + 1}
	if r := mustOK(t, f, rel); !r.GrantedAt.Equal(time.Unix(0, 10)) {
		t.Fatalf("release: got %+v, want granted at 10", r)
	}
	if r := mustOK(t, f, rel); !r.GrantedAt.IsZero() || !r.Duplicate {
		t.Fatalf("repeated release: got %+v, want no hold ended", r)
	}
	mustOK(t, f, &fsmv1.ExpireSession{SessionId: "b"}) // b held x since the release: a lock-delay starts
	if r := apply(t, f, &fsmv1.Acquire{SessionId: "c", Seq: 1, Name: "x", Mode: excl}); r.Code != fsm.CodeBusy || !r.Delayed {
		t.Fatalf("try during a lock-delay: got %+v, want busy and delayed", r)
	}
	mustOK(t, f, &fsmv1.Acquire{SessionId: "c", Seq: 2, Name: "y", Mode: excl, TimeUnixNano: 40})
	mustOK(t, f, &fsmv1.Acquire{SessionId: "c", Seq: 3, Name: "z", Mode: excl, TimeUnixNano: 50})
	if r := mustOK(t, f, &fsmv1.ExpireSession{SessionId: "c"}); !slices.EqualFunc(r.HoldsGrantedAt, []time.Time{time.Unix(0, 40), time.Unix(0, 50)}, time.Time.Equal) {
		t.Fatalf("expiry: got %+v, want holds granted at 40 and 50", r)
	}
}

// checkSet checks the set request (AcquireMany) that head belongs to: it
// waits in exactly SetSize queues (never part of a set), holds none of
// them with its seq, and cannot be granted as a whole (it does not head
// every one of its queues, or one of its locks is busy for it).
func checkSet(snap *fsmv1.Snapshot, head *fsmv1.Wait) error {
	waits, grantableAll := 0, true
	for _, l := range snap.Locks {
		for i, w := range l.Queue {
			if w.SessionId != head.SessionId || w.Seq != head.Seq {
				continue
			}
			waits++
			if w.SetSize != head.SetSize {
				return fmt.Errorf("set request %s/%d: set sizes %d and %d", head.SessionId, head.Seq, w.SetSize, head.SetSize)
			}
			if i != 0 || l.Delayed || !grantable(l, w.Mode) {
				grantableAll = false
			}
		}
		for _, h := range l.Holders {
			if h.SessionId == head.SessionId && h.Seq == head.Seq {
				return fmt.Errorf("set request %s/%d holds %q while it waits: part of a set", head.SessionId, head.Seq, l.Name)
			}
		}
	}
	switch {
	case waits != int(head.SetSize):
		return fmt.Errorf("set request %s/%d waits in %d queues, its set has %d locks", head.SessionId, head.Seq, waits, head.SetSize)
	case grantableAll:
		return fmt.Errorf("set request %s/%d heads every queue and fits every lock, but waits", head.SessionId, head.Seq)
	}
	return nil
}
