package fsm_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestVersionTableCoversEveryCommand: every command type Decode knows has
// a version (a new command cannot be forgotten), at most ApplyVersion, and
// a type Decode does not know needs more than any binary applies.
func TestVersionTableCoversEveryCommand(t *testing.T) {
	known := 0
	for b := 0; b < 256; b++ {
		kind, m, err := fsm.Decode([]byte{byte(b)})
		v := fsm.NeedsVersion(fsm.CmdType(b), m)
		if err != nil {
			if v <= fsm.ApplyVersion {
				t.Errorf("unknown type %d needs version %d, want above %d", b, v, fsm.ApplyVersion)
			}
			continue
		}
		known++
		if v == 0 || v > fsm.ApplyVersion {
			t.Errorf("command type %d: NeedsVersion %d, want 1..%d (a row in versionTable)", kind, v, fsm.ApplyVersion)
		}
	}
	if known < 15 {
		t.Fatalf("only %d command types decode", known)
	}
}

// TestNeedsVersionOfVersionOneCommands: every command a binary before the
// gate could propose needs version 1, whatever its fields; so the gate
// refuses nothing a cluster of older nodes accepted.
func TestNeedsVersionOfVersionOneCommands(t *testing.T) {
	lim := uint32(3)
	cases := map[fsm.CmdType]proto.Message{
		fsm.CmdInit:              &fsmv1.Init{ClusterId: "c", Epoch: 1, TimeUnixNano: 1},
		fsm.CmdCreateSession:     &fsmv1.CreateSession{RequestId: "r", SessionId: "s", TtlMs: 1000, Owner: "o", SecretHash: []byte{1}, Identity: "i", IdentitySessionsCap: 4},
		fsm.CmdCloseSession:      &fsmv1.CloseSession{SessionId: "s", Seq: 1},
		fsm.CmdExpireSession:     &fsmv1.ExpireSession{SessionId: "s", Term: 2, Forced: true},
		fsm.CmdRevokeSession:     &fsmv1.RevokeSession{SessionIds: []string{"s"}},
		fsm.CmdAcquire:           &fsmv1.Acquire{SessionId: "s", Seq: 1, Ack: 1, Name: "n", Mode: 2, Limit: &lim, Wait: true, Value: []byte("v"), LockDelayMs: 5, Identity: "i"},
		fsm.CmdRelease:           &fsmv1.Release{SessionId: "s", Seq: 2, Name: "n", Token: 7},
		fsm.CmdCancel:            &fsmv1.Cancel{SessionId: "s", Seq: 3, Name: "n", AcquireSeq: 1},
		fsm.CmdSetMember:         &fsmv1.SetMember{NodeId: "a", ApiUrl: "http://x", RaftAddress: "x", NonVoter: true},
		fsm.CmdRestore:           &fsmv1.Restore{Snapshot: []byte{1}, ClusterId: "c", Epoch: 1},
		fsm.CmdComplete:          &fsmv1.Complete{SessionId: "s", Seq: 4, Name: "n", Token: 7, RetentionMs: 9},
		fsm.CmdClearMark:         &fsmv1.ClearMark{Name: "n", Token: 7, Term: 2},
		fsm.CmdUndelay:           &fsmv1.Undelay{Name: "n", Token: 7, Term: 2},
		fsm.CmdSetValue:          &fsmv1.SetValue{SessionId: "s", Seq: 5, Name: "n", Token: 7, Value: []byte("w")},
		fsm.CmdSetClusterVersion: &fsmv1.SetClusterVersion{Version: 2},
	}
	for kind, m := range cases {
		if v := fsm.NeedsVersion(kind, m); v != 1 {
			t.Errorf("command type %d needs version %d, want 1", kind, v)
		}
	}
}

func setClusterVersion(t *testing.T, f *fsm.FSM, v uint32) *fsm.Result {
	t.Helper()
	b, err := fsm.Encode(fsm.CmdSetClusterVersion, &fsmv1.SetClusterVersion{Version: v})
	if err != nil {
		t.Fatal(err)
	}
	return f.ApplyCommand(b)
}

// TestSetClusterVersionOnlyRaises: Apply raises the cluster version and
// never lowers it; version 0 is refused.
func TestSetClusterVersionOnlyRaises(t *testing.T) {
	f := fsm.New(nil)
	if v := f.ClusterVersion(); v != 1 {
		t.Fatalf("new FSM: cluster version %d, want 1", v)
	}
	steps := []struct {
		set, want uint32
		code      fsm.Code
	}{{1, 1, fsm.OK}, {2, 2, fsm.OK}, {1, 2, fsm.OK}, {0, 2, fsm.CodeInvalid}, {5, 5, fsm.OK}, {3, 5, fsm.OK}}
	for _, s := range steps {
		if r := setClusterVersion(t, f, s.set); r.Code != s.code {
			t.Fatalf("set %d: code %d (%s), want %d", s.set, r.Code, r.Msg, s.code)
		}
		if v := f.ClusterVersion(); v != s.want {
			t.Fatalf("after set %d: cluster version %d, want %d", s.set, v, s.want)
		}
	}
}

// TestClusterVersionSnapshot: the cluster version travels in snapshots
// (field 9); a cluster still at version 1 writes the snapshot bytes it
// wrote before the field existed; a Restore of a backup keeps the new
// cluster's version.
func TestClusterVersionSnapshot(t *testing.T) {
	f := fsm.New(nil)
	old, err := fsm.EncodeSnapshot(f.State())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(old, []byte{9 << 3}) {
		t.Fatalf("a version-1 snapshot carries field 9: %x", old)
	}
	setClusterVersion(t, f, 2)
	b, err := fsm.EncodeSnapshot(f.State())
	if err != nil {
		t.Fatal(err)
	}
	g := fsm.New(nil)
	if err := g.RestoreBytes(b); err != nil {
		t.Fatal(err)
	}
	if v := g.ClusterVersion(); v != 2 {
		t.Fatalf("restored cluster version %d, want 2", v)
	}
	// A snapshot at version 2 loaded over a state at version 1 lowers
	// nothing it should not: it is the state at that index.
	if err := g.RestoreBytes(old); err != nil {
		t.Fatal(err)
	}
	if v := g.ClusterVersion(); v != 1 {
		t.Fatalf("after loading a version-1 snapshot: %d, want 1", v)
	}

	// Restore (a backup into a new cluster) keeps this cluster's version.
	h := fsm.New(nil)
	rb, err := fsm.Encode(fsm.CmdRestore, &fsmv1.Restore{Snapshot: b, ClusterId: "new", Epoch: 10})
	if err != nil {
		t.Fatal(err)
	}
	if r := h.ApplyCommand(rb); r.Code != fsm.OK {
		t.Fatalf("restore: %d %s", r.Code, r.Msg)
	}
	if v := h.ClusterVersion(); v != 1 {
		t.Fatalf("after restoring a version-2 backup into a new cluster: %d, want 1", v)
	}
}

// TestCloseSessionTimeNeedsVersion2: a CloseSession with its time needs
// version 2 (an older node would grant the waiters it lets in at time 0,
// and the replicas would differ), and Apply grants them at that time.
func TestCloseSessionTimeNeedsVersion2(t *testing.T) {
	if v := fsm.NeedsVersion(fsm.CmdCloseSession, &fsmv1.CloseSession{SessionId: "s", Seq: 1, TimeUnixNano: 5}); v != 2 {
		t.Fatalf("CloseSession with a time needs version %d, want 2", v)
	}
	f := initFSM(t, nil)
	mustOK(t, f, newSession("s1"))
	mustOK(t, f, newSession("s2"))
	mustOK(t, f, acq("s1", 1, "a", excl, false))
	mustOK(t, f, acq("s2", 1, "a", excl, true))
	mustOK(t, f, &fsmv1.CloseSession{SessionId: "s1", Seq: 2, TimeUnixNano: 1_700_000_000_000_000_000})
	if l, ok := f.Describe("a"); !ok || len(l.Holders) != 1 || l.Holders[0].GrantedAt.UnixNano() != 1_700_000_000_000_000_000 {
		t.Fatalf("the waiter a close let in: %+v", l)
	}
}
