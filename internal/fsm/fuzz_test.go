package fsm_test

import (
	"testing"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// fuzzScript builds a state with something of everything: an exclusive
// holder with a queue behind it, a semaphore, a read lock with a writer and
// a reader waiting, a revoked session and a filled duplicate table.
func fuzzScript() []proto.Message {
	return []proto.Message{
		&fsmv1.Init{ClusterId: "c1", Epoch: epoch},
		newSession("s1"), newSession("s2"), newSession("s3"), newSession("s4"),
		acq("s1", 1, "a", excl, false),
		acq("s2", 1, "a", excl, true),
		acq("s3", 1, "a", shrd, true),
		acqLimit("s1", 2, "sem", shrd, false, 2),
		acqLimit("s2", 2, "sem", shrd, false, 2),
		acq("s3", 2, "sem", shrd, true),
		acqLimit("s4", 1, "rw", shrd, false, 0),
		acq("s1", 3, "rw", excl, true),
		acq("s2", 3, "rw", shrd, true),
		acq("s4", 2, "a", excl, false), // refused: busy
		&fsmv1.RevokeSession{SessionIds: []string{"s4"}},
		&fsmv1.SetMember{NodeId: "n1", ApiUrl: "http://n1:7070", RaftAddress: "n1:7071"},
	}
}

// fuzzMore are further valid commands on the scripted state.
func fuzzMore() []proto.Message {
	return []proto.Message{
		rel("s1", 4, "a", epoch+1),
		rel("s2", 4, "sem", epoch+3),
		rel("s4", 3, "rw", epoch+4),
		rel("s1", 4, "a", epoch+2), // wrong token
		&fsmv1.Cancel{SessionId: "s2", Seq: 4, Name: "a", AcquireSeq: 1},
		&fsmv1.Cancel{SessionId: "s1", Seq: 4, Name: "a", AcquireSeq: 1, Ack: 4},
		&fsmv1.CloseSession{SessionId: "s1", Seq: 4},
		&fsmv1.ExpireSession{SessionId: "s4", TimeUnixNano: 1},
		&fsmv1.RevokeSession{SessionIds: []string{"s1", "s2"}},
		acq("s4", 1, "a", excl, false), // duplicate
		acq("s1", 4, "b", excl, true),
		&fsmv1.Acquire{SessionId: "s2", Seq: 9, Ack: 3, Name: "b", Mode: shrd, Limit: proto.Uint32(3), Value: []byte("v"), Wait: true},
		&fsmv1.CreateSession{RequestId: "r5", SessionId: "s5", TtlMs: 2000, Owner: "o"},
		&fsmv1.Init{ClusterId: "c2", Epoch: 5},
		&fsmv1.SetMember{NodeId: "n2", ApiUrl: "http://n2:7070", RaftAddress: "n2:7071"},
		&fsmv1.SetMember{NodeId: "n1", Remove: true},
		&fsmv1.Complete{SessionId: "s1", Seq: 4, Ack: 4, Name: "a", Token: epoch + 1, RetentionMs: 60000},
		&fsmv1.Complete{SessionId: "s1", Seq: 4, Ack: 4, Name: "a", Token: epoch + 2, RetentionMs: 60000}, // wrong token
		&fsmv1.ClearMark{Name: "a", Token: epoch + 1},
	}
}

func scripted(tb fataler) *fsm.FSM {
	tb.Helper()
	f := fsm.New(nil)
	for _, m := range fuzzScript() {
		apply(tb, f, m)
	}
	return f
}

// lockTable is snap without the duplicate tables, which a refused request
// may change (it records the refusal and may carry a new ack).
func lockTable(snap *fsmv1.Snapshot) *fsmv1.Snapshot {
	snap = proto.CloneOf(snap)
	for _, s := range snap.Sessions {
		s.Results, s.Ack = nil, 0
	}
	return snap
}

func addCommandSeeds(f *testing.F) {
	for _, m := range append(fuzzScript(), fuzzMore()...) {
		f.Add(cmd(f, m))
	}
	f.Add(cmd(f, &fsmv1.Restore{ClusterId: "r", Epoch: epoch + 7, Snapshot: persist(f, scripted(f))}))
	// An epoch this close to the top would wrap the token counter.
	f.Add(cmd(f, &fsmv1.Init{ClusterId: "c9", Epoch: ^uint64(0) - 2}))
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add([]byte{byte(fsm.CmdAcquire), 0xff})
	f.Add([]byte{200, 1, 2, 3})
}

// FuzzApply applies arbitrary bytes to a scripted FSM: never a panic, the
// invariants hold, a refusal changes no lock, the same bytes applied again
// change nothing, and a twin FSM and a restored copy agree.
func FuzzApply(f *testing.F) {
	addCommandSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := scripted(t), scripted(t)
		before := a.State()
		r := a.ApplyCommand(data)
		if r.Code != fsm.OK && r.Msg == "" {
			t.Fatalf("refusal without a message: %+v", r)
		}
		after := a.State()
		if err := checkInvariants(after); err != nil {
			t.Fatal(err)
		}
		if err := checkCaps(after, fsm.CurrentCaps()); err != nil {
			t.Fatal(err)
		}
		if err := a.CheckCounts(); err != nil {
			t.Fatal(err)
		}
		if r.Code != fsm.OK && !proto.Equal(lockTable(before), lockTable(after)) {
			t.Fatalf("refused (code %d %q) but changed:\n got %v\nwant %v", r.Code, r.Msg, after, before)
		}
		old := map[uint64]bool{}
		for _, l := range before.Locks {
			for _, h := range l.Holders {
				old[h.Token] = true
			}
		}
		for _, l := range after.Locks {
			for _, h := range l.Holders {
				if !old[h.Token] && h.Token <= before.LastToken {
					t.Fatalf("new grant on %q with token %d, not above %d", l.Name, h.Token, before.LastToken)
				}
			}
		}
		if rb := b.ApplyCommand(data); resultString(rb) != resultString(r) {
			t.Fatalf("twin result %s, first %s", resultString(rb), resultString(r))
		}
		if got := b.State(); !proto.Equal(got, after) {
			t.Fatalf("twin state differs")
		}
		a.ApplyCommand(data)
		if again := a.State(); !proto.Equal(again, after) {
			t.Fatalf("applying the same bytes again changed the state:\n got %v\nwant %v", again, after)
		}
		c := fsm.New(nil)
		if err := c.RestoreBytes(persist(t, a)); err != nil {
			t.Fatalf("restore of own snapshot: %v", err)
		}
		if got := c.State(); !proto.Equal(got, after) {
			t.Fatalf("restored state differs")
		}

		// The same bytes as the first command of a new FSM (an Init, say),
		// then the script: still safe.
		d := fsm.New(nil)
		d.ApplyCommand(data)
		for _, m := range append(fuzzScript(), fuzzMore()...) {
			apply(t, d, m)
			if err := checkInvariants(d.State()); err != nil {
				t.Fatalf("first command %x, then %v: %v", data, m, err)
			}
		}
	})
}

// FuzzDecode: Decode never panics, reads what protobuf-go reads, and what
// it accepts encodes back to an equal command. ValidateName agrees with
// the rules it states.
func FuzzDecode(f *testing.F) {
	addCommandSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		typ, m, err := fsm.Decode(data)
		if err != nil {
			if m != nil {
				t.Fatalf("Decode error %v with a message %v", err, m)
			}
		} else {
			// Decode reads what protobuf-go reads (codec.UnmarshalExact).
			want := m.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(data[1:], want); err != nil || !proto.Equal(m, want) {
				t.Fatalf("Decode read %v; protobuf-go %v (%v)", m, want, err)
			}
			b, err := fsm.Encode(typ, m)
			if err != nil {
				t.Fatalf("Encode of a decoded %T: %v", m, err)
			}
			typ2, m2, err := fsm.Decode(b)
			if err != nil || typ2 != typ || !proto.Equal(m, m2) {
				t.Fatalf("round trip: got %d %v %v, want %d %v", typ2, m2, err, typ, m)
			}
		}
		name := string(data)
		valid := len(name) > 0 && len(name) <= fsm.MaxNameBytes && utf8.ValidString(name)
		for _, r := range name {
			valid = valid && !unicode.IsControl(r)
		}
		if err := fsm.ValidateName(name); (err == nil) != valid {
			t.Fatalf("ValidateName(%q): got %v, want valid=%v", name, err, valid)
		}
	})
}

// FuzzRestore: RestoreBytes never panics; on error the state is unchanged;
// an accepted snapshot is safe, round-trips, and can be run down by
// expiring every session.
func FuzzRestore(f *testing.F) {
	full := scripted(f)
	f.Add(persist(f, full))
	for _, m := range fuzzMore() {
		apply(f, full, m)
		f.Add(persist(f, full))
	}
	f.Add(persist(f, fsm.New(nil)))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		a := scripted(t)
		before := a.State()
		err := a.RestoreBytes(data)
		checkRestoreWhole(t, data, err, a) // snapshot_decode_test.go
		if err != nil {
			if got := a.State(); !proto.Equal(got, before) {
				t.Fatalf("failed restore (%v) changed the state", err)
			}
			return
		}
		snap := a.State()
		if err := checkSafety(snap); err != nil {
			t.Fatalf("accepted snapshot breaks safety: %v", err)
		}
		b := fsm.New(nil)
		if err := b.RestoreBytes(persist(t, a)); err != nil {
			t.Fatalf("restore of a restored state's snapshot: %v", err)
		}
		if got := b.State(); !proto.Equal(got, snap) {
			t.Fatalf("second restore differs")
		}
		for _, s := range snap.Sessions {
			apply(t, a, acq(s.Id, s.Ack+1, "fuzz", shrd, true))
			apply(t, a, &fsmv1.ExpireSession{SessionId: s.Id})
			if err := checkSafety(a.State()); err != nil {
				t.Fatalf("after expiring %s: %v", s.Id, err)
			}
		}
		for _, l := range a.State().Locks {
			if len(l.Holders)+len(l.Queue) > 0 {
				t.Fatalf("lock %q still has holders or waiters after every session expired", l.Name)
			}
		}
	})
}
