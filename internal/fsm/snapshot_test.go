package fsm_test

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

func TestRaftInterface(t *testing.T) {
	var _ raft.BatchingFSM = (*fsm.FSM)(nil)
	f := fsm.New(nil)
	logs := []*raft.Log{
		{Index: 1, Type: raft.LogConfiguration, Data: []byte{0xff}},
		{Index: 2, Type: raft.LogCommand, Data: cmd(t, &fsmv1.Init{ClusterId: "c1", Epoch: epoch})},
		{Index: 3, Type: raft.LogCommand, Data: cmd(t, newSession("s1"))},
		{Index: 4, Type: raft.LogCommand, Data: cmd(t, acq("s1", 1, "a", excl, false))},
		{Index: 5, Type: raft.LogCommand, Data: []byte{42}},
	}
	out := f.ApplyBatch(logs)
	if out[0] != nil {
		t.Fatalf("configuration entry: got %v, want nil", out[0])
	}
	if r := out[3].(*fsm.Result); r.Token != epoch+1 {
		t.Fatalf("batched acquire: got %+v, want token %d", r, uint64(epoch+1))
	}
	if r := out[4].(*fsm.Result); r.Code != fsm.CodeInvalid {
		t.Fatalf("unknown command in a batch: got %+v, want CodeInvalid", r)
	}
	r := f.Apply(&raft.Log{Index: 6, Type: raft.LogCommand, Data: cmd(t, rel("s1", 2, "a", epoch+1))}).(*fsm.Result)
	if r.Code != fsm.OK {
		t.Fatalf("release: got %+v, want OK", r)
	}
}

func TestSnapshotRestore(t *testing.T) {
	f := initFSM(t, nil)
	for _, id := range []string{"s1", "s2", "s3"} {
		mustOK(t, f, newSession(id))
	}
	a := acq("s1", 1, "a", excl, false)
	a.Value = []byte("owner metadata")
	a.TimeUnixNano = 7
	mustOK(t, f, a)
	mustOK(t, f, acq("s2", 1, "a", shrd, true))
	mustOK(t, f, acqLimit("s2", 2, "sem", shrd, false, 2))
	mustOK(t, f, acq("s3", 1, "sem", shrd, false))
	mustOK(t, f, &fsmv1.RevokeSession{SessionIds: []string{"s3"}})
	mustOK(t, f, &fsmv1.SetMember{NodeId: "n1", ApiUrl: "http://n1:7070", RaftAddress: "n1:7071"})
	want := f.State()
	if len(want.Members) != 1 {
		t.Fatalf("members in state: got %v, want n1", want.Members)
	}

	rec := &recorder{}
	g := fsm.New(rec)
	if err := g.Restore(io.NopCloser(bytes.NewReader(persist(t, f)))); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got := g.State(); !proto.Equal(got, want) {
		t.Fatalf("restored state:\n got %v\nwant %v", got, want)
	}
	if got := rec.take(); !slices.Equal(got, []string{"restored"}) {
		t.Fatalf("events: got %q, want [restored]", got)
	}
	// The restored FSM goes on exactly like the original.
	for _, m := range []proto.Message{
		rel("s1", 2, "a", epoch+1),
		acq("s1", 1, "a", excl, false), // duplicate
		acq("s3", 2, "b", excl, false), // revoked
		&fsmv1.ExpireSession{SessionId: "s2"},
		acq("s1", 3, "sem", shrd, false),
	} {
		r1, r2 := apply(t, f, m), apply(t, g, m)
		if fmt.Sprint(r1) != fmt.Sprint(r2) {
			t.Fatalf("%v: original %+v, restored %+v", m, r1, r2)
		}
	}
	if got, want := g.State(), f.State(); !proto.Equal(got, want) {
		t.Fatalf("after the same commands:\n got %v\nwant %v", got, want)
	}
}

func TestRestoreRefusesBadSnapshots(t *testing.T) {
	good := func() *fsmv1.Snapshot {
		return &fsmv1.Snapshot{
			ClusterId: "c1", Epoch: 100, LastToken: 110,
			Sessions: []*fsmv1.Session{{Id: "s1", TtlMs: 1000}, {Id: "s2", TtlMs: 1000}},
			Locks: []*fsmv1.Lock{
				{Name: "a", Limit: 2, Holders: []*fsmv1.Hold{{SessionId: "s1", Mode: shrd, Token: 105}, {SessionId: "s2", Mode: shrd, Token: 107}}},
				{Name: "b", Limit: 1, Holders: []*fsmv1.Hold{{SessionId: "s1", Mode: excl, Token: 110}}, Queue: []*fsmv1.Wait{{SessionId: "s2", Mode: excl, Seq: 3}}},
			},
		}
	}
	tests := []struct {
		name  string
		edit  func(*fsmv1.Snapshot)
		bytes []byte
		msg   string
	}{
		{name: "empty", bytes: []byte{}, msg: "unknown snapshot format"},
		{name: "version 2", bytes: []byte{2}, msg: "unknown snapshot format"},
		{name: "garbage", bytes: []byte{1, 0xff, 0xff}, msg: "decode snapshot"},
		{name: "duplicate session", edit: func(s *fsmv1.Snapshot) { s.Sessions[1].Id = "s1" }, msg: "duplicate session id"},
		{name: "empty session id", edit: func(s *fsmv1.Snapshot) { s.Sessions[0].Id = "" }, msg: "bad or duplicate session id"},
		{name: "duplicate lock", edit: func(s *fsmv1.Snapshot) { s.Locks[1].Name = "a" }, msg: "duplicate lock"},
		{name: "unknown holder", edit: func(s *fsmv1.Snapshot) { s.Locks[0].Holders[0].SessionId = "s9" }, msg: "bad holder"},
		{name: "holder twice", edit: func(s *fsmv1.Snapshot) { s.Locks[0].Holders[1].SessionId = "s1" }, msg: "bad holder"},
		{name: "holder waits too", edit: func(s *fsmv1.Snapshot) { s.Locks[1].Queue[0].SessionId = "s1" }, msg: "bad waiter"},
		{name: "unknown waiter", edit: func(s *fsmv1.Snapshot) { s.Locks[1].Queue[0].SessionId = "s9" }, msg: "bad waiter"},
		{name: "waiter mode", edit: func(s *fsmv1.Snapshot) { s.Locks[1].Queue[0].Mode = 0 }, msg: "has mode 0"},
		{name: "holder mode", edit: func(s *fsmv1.Snapshot) { s.Locks[0].Holders[0].Mode = 9 }, msg: "has mode 9"},
		{name: "exclusive not alone", edit: func(s *fsmv1.Snapshot) { s.Locks[0].Holders[1].Mode = excl }, msg: "exclusive holder not alone"},
		{name: "two exclusive", edit: func(s *fsmv1.Snapshot) {
			s.Locks[0].Holders[0].Mode, s.Locks[0].Holders[1].Mode = excl, excl
		}, msg: "exclusive holder not alone"},
		{name: "over limit", edit: func(s *fsmv1.Snapshot) { s.Locks[0].Limit = 1 }, msg: "more holders than its limit 1"},
		{name: "token above counter", edit: func(s *fsmv1.Snapshot) { s.Locks[1].Holders[0].Token = 111 }, msg: "bad or repeated token 111"},
		{name: "token zero", edit: func(s *fsmv1.Snapshot) { s.Locks[1].Holders[0].Token = 0 }, msg: "bad or repeated token 0"},
		{name: "token repeated", edit: func(s *fsmv1.Snapshot) { s.Locks[1].Holders[0].Token = 105 }, msg: "bad or repeated token 105"},
		{name: "holders out of order", edit: func(s *fsmv1.Snapshot) { s.Locks[0].Holders[1].Token = 101 }, msg: "not in token order"},
		{name: "counter below epoch", edit: func(s *fsmv1.Snapshot) { s.LastToken = 99 }, msg: "bad token counter"},
		{name: "counter could wrap", edit: func(s *fsmv1.Snapshot) { s.LastToken = ^uint64(0) }, msg: "bad token counter"},
		{name: "epoch too large", edit: func(s *fsmv1.Snapshot) { s.Epoch, s.LastToken = 1<<62, 1<<62 }, msg: "bad token counter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := initFSM(t, nil)
			mustOK(t, f, newSession("x"))
			mustOK(t, f, acq("x", 1, "x", excl, false))
			before := f.State()
			b := tt.bytes
			if tt.edit != nil {
				s := good()
				if err := fsm.New(nil).Load(s); err != nil {
					t.Fatalf("good snapshot refused: %v", err)
				}
				tt.edit(s)
				enc, err := proto.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				b = append([]byte{1}, enc...)
			}
			err := f.RestoreBytes(b)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %v, want one containing %q", err, tt.msg)
			}
			if after := f.State(); !proto.Equal(before, after) {
				t.Fatalf("refused restore changed the state:\n got %v\nwant %v", after, before)
			}
		})
	}
}

func TestRestoreCommand(t *testing.T) {
	backup := persist(t, scripted(t))
	backupState := scripted(t).State()
	restore := func(epoch uint64, snap []byte) *fsmv1.Restore {
		return &fsmv1.Restore{ClusterId: "new", Epoch: epoch, Snapshot: snap}
	}

	// Tokens continue above the backup's even with an older epoch.
	// As a Raft entry, the restore is a reset of the event stream (its
	// consumers read the new state), with no event of its own.
	rec := &recorder{}
	f := fsm.New(rec)
	if r, ok := f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: cmd(t, restore(5, backup))}).(*fsm.Result); !ok || r.Code != fsm.OK {
		t.Fatalf("restore: got %+v", r)
	}
	if info := f.Info(); info.ClusterID != "new" || info.LastToken != backupState.LastToken || info.Epoch != backupState.LastToken {
		t.Fatalf("after restore: got %+v, want cluster new, epoch and last token %d", info, backupState.LastToken)
	}
	if got, want := rec.take(), []string{"restored"}; !slices.Equal(got, want) {
		t.Fatalf("events: got %q, want %q", got, want)
	}
	mustOK(t, f, newSession("s9"))
	if r := mustOK(t, f, acq("s9", 1, "fresh", excl, false)); r.Token != backupState.LastToken+1 {
		t.Fatalf("first grant after restore: got token %d, want %d", r.Token, backupState.LastToken+1)
	}
	if err := checkInvariants(f.State()); err != nil {
		t.Fatal(err)
	}

	// A later epoch wins.
	g := fsm.New(nil)
	mustOK(t, g, restore(backupState.LastToken+1000, backup))
	if info := g.Info(); info.LastToken != backupState.LastToken+1000 {
		t.Fatalf("restore with a later epoch: got last token %d, want %d", info.LastToken, backupState.LastToken+1000)
	}

	hostile := proto.CloneOf(backupState)
	hostile.Epoch, hostile.LastToken = 1<<62-1, 1<<62+5
	hb, err := proto.Marshal(hostile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		f    *fsm.FSM
		m    *fsmv1.Restore
		msg  string
	}{
		{"into a cluster with state", scripted(t), restore(5, backup), "already has state"},
		{"without cluster id", fsm.New(nil), &fsmv1.Restore{Epoch: 5, Snapshot: backup}, "without cluster id"},
		{"epoch too large", fsm.New(nil), restore(1<<62, backup), "restore epoch"},
		{"garbage", fsm.New(nil), restore(5, []byte{1, 0xff}), "decode snapshot"},
		{"no snapshot", fsm.New(nil), restore(5, nil), "unknown snapshot format"},
		{"counter too high", fsm.New(nil), restore(5, append([]byte{1}, hb...)), "is not below"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.f.State()
			r := apply(t, tt.f, tt.m)
			if r.Code != fsm.CodeInvalid || !strings.Contains(r.Msg, tt.msg) {
				t.Fatalf("got code %d %q, want CodeInvalid containing %q", r.Code, r.Msg, tt.msg)
			}
			if after := tt.f.State(); !proto.Equal(before, after) {
				t.Fatalf("refused restore changed the state")
			}
		})
	}
}

// CheckBackup, which `lockd serve --restore` runs at start, refuses exactly
// the backups the Restore command refuses, so a node never starts with a
// backup that Apply then refuses on every try. A backup whose counter is
// in [2^62, 2^63) is a state of a cluster (RestoreBytes loads it) but not a
// backup a new cluster can continue from.
func TestCheckBackupRunsTheRestoreChecks(t *testing.T) {
	good := persist(t, scripted(t))
	high := scripted(t).State()
	high.Epoch, high.LastToken = 1<<62-1, 1<<62+5
	highB := encodeSnapshot(t, high)
	if err := fsm.New(nil).RestoreBytes(highB); err != nil {
		t.Fatalf("the high counter is a valid state: %v", err)
	}
	for _, tt := range []struct {
		name   string
		backup []byte
		ok     bool
	}{
		{"good", good, true},
		{"counter too high for a new epoch", highB, false},
		{"garbage", []byte{1, 0xff}, false},
		{"empty", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := fsm.CheckBackup(tt.backup)
			r := apply(t, fsm.New(nil), &fsmv1.Restore{ClusterId: "new", Epoch: 5, Snapshot: tt.backup})
			if (err == nil) != tt.ok || (r.Code == fsm.OK) != tt.ok {
				t.Fatalf("CheckBackup: %v; Apply: code %d %q; want both ok=%v", err, r.Code, r.Msg, tt.ok)
			}
			if err != nil && !strings.Contains(r.Msg, err.Error()) {
				t.Fatalf("CheckBackup says %q, Apply %q: want the same reason", err, r.Msg)
			}
		})
	}
}

// A snapshot beyond a cap is refused by the one check both paths run; an
// older version's duplicate table beyond its cap (a Cancel before its
// Acquire added answers outside it) is trimmed as Apply would have, so an
// old node's snapshot still loads.
func TestSnapshotCaps(t *testing.T) {
	f := scripted(t)
	st := f.State()
	caps := fsm.CurrentCaps()
	caps.Sessions = len(st.Sessions) - 1
	fsm.SetCaps(t, caps)
	if err := fsm.New(nil).Load(st); err == nil || !strings.Contains(err.Error(), "sessions, more than") {
		t.Fatalf("too many sessions: got %v", err)
	}
	caps.Sessions = len(st.Sessions)
	caps.Results = 3
	fsm.SetCaps(t, caps)
	st.Sessions[0].Ack = 1
	st.Sessions[0].Results = nil
	for seq := uint64(1); seq <= 10; seq++ {
		st.Sessions[0].Results = append(st.Sessions[0].Results, &fsmv1.Result{Seq: seq})
	}
	g := fsm.New(nil)
	if err := g.Load(st); err != nil {
		t.Fatal(err)
	}
	s := g.State().Sessions[0]
	if len(s.Results) != 3 || s.Ack != 8 || s.Results[0].Seq != 8 {
		t.Fatalf("trimmed table: ack %d answers %v, want ack 8 and seqs 8-10", s.Ack, s.Results)
	}
}

func encodeSnapshot(t *testing.T, snap *fsmv1.Snapshot) []byte {
	t.Helper()
	b, err := fsm.EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
