package fsm_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// A restore unmarshals locks a few batches ahead of the goroutine building
// them, and indexes them on a third (snapshot_decode.go). These tests use
// snapshots of several batches (256 locks each) and put the faults in
// batches after the first, where the stages run apart: the state and the
// refusal must be those of doing one lock after another.

const aheadLocks = 5*256 + 37

// aheadSnapshot is a valid snapshot of aheadLocks exclusive locks, named in
// ascending order and held by two sessions in turn.
func aheadSnapshot() *fsmv1.Snapshot {
	s := &fsmv1.Snapshot{ClusterId: "c1", Epoch: 100, LastToken: 100 + aheadLocks,
		Sessions: []*fsmv1.Session{{Id: "s1", TtlMs: 1000}, {Id: "s2", TtlMs: 1000}}}
	for i := range aheadLocks {
		s.Locks = append(s.Locks, &fsmv1.Lock{Name: fmt.Sprintf("l%05d", i), Limit: 1,
			Holders: []*fsmv1.Hold{{SessionId: fmt.Sprint("s", 1+i%2), Mode: excl, Token: uint64(101 + i)}}})
	}
	return s
}

// TestRestoreAheadBuildsTheState: a snapshot of several batches, in name
// order and with two locks swapped (the rest then indexed as they come),
// restores to exactly its state, with the name index whole.
func TestRestoreAheadBuildsTheState(t *testing.T) {
	for _, swap := range []int{-1, 0, 255, 256, 700, aheadLocks - 2} {
		t.Run(fmt.Sprint("swap ", swap), func(t *testing.T) {
			s := aheadSnapshot()
			if swap >= 0 {
				s.Locks[swap], s.Locks[swap+1] = s.Locks[swap+1], s.Locks[swap]
			}
			f := fsm.New(nil)
			if err := f.RestoreBytes(encodeSnapshot(t, s)); err != nil {
				t.Fatal(err)
			}
			if err := f.CheckNames(); err != nil {
				t.Fatal(err)
			}
			if err := f.CheckCounts(); err != nil {
				t.Fatal(err)
			}
			want := aheadSnapshot() // State lists the locks by name
			if got := f.State(); !proto.Equal(got, want) {
				t.Fatalf("restored state differs: %d locks, want %d", len(got.Locks), len(want.Locks))
			}
			for i := range aheadLocks {
				name := fmt.Sprintf("l%05d", i)
				if info, ok := f.Describe(name); !ok || len(info.Holders) != 1 || info.Holders[0].Token != uint64(101+i) {
					t.Fatalf("lock %s after restore: %+v, %v", name, info, ok)
				}
			}
		})
	}
}

// TestRestoreAheadRefusesInOrder: of two faults, the one in the earlier
// lock is reported (in one lock, its name's repeat first), whichever stage
// finds it, and a refused restore leaves the state as it was.
func TestRestoreAheadRefusesInOrder(t *testing.T) {
	dup := func(at, of int) func(*fsmv1.Snapshot) {
		return func(s *fsmv1.Snapshot) { s.Locks[at].Name = s.Locks[of].Name }
	}
	badHolder := func(at int) func(*fsmv1.Snapshot) {
		return func(s *fsmv1.Snapshot) { s.Locks[at].Holders[0].SessionId = "s9" }
	}
	// badBytes makes lock at fail to unmarshal: its name becomes bytes
	// that are not UTF-8, after encoding.
	const marker = "\x00MARKER\x00"
	badBytes := func(at int) func(*fsmv1.Snapshot) {
		return func(s *fsmv1.Snapshot) { s.Locks[at].Name = marker }
	}
	tests := []struct {
		name  string
		edits []func(*fsmv1.Snapshot)
		msg   string
	}{
		{"repeat in a later batch", []func(*fsmv1.Snapshot){dup(900, 3)}, `duplicate lock "l00003"`},
		{"repeat of the lock before", []func(*fsmv1.Snapshot){dup(600, 599)}, `duplicate lock "l00599"`},
		{"bad holder in a later batch", []func(*fsmv1.Snapshot){badHolder(1000)}, `lock "l01000": bad holder "s9"`},
		{"bad holder before a repeat", []func(*fsmv1.Snapshot){badHolder(700), dup(900, 3)}, `lock "l00700": bad holder "s9"`},
		{"repeat before a bad holder", []func(*fsmv1.Snapshot){dup(700, 3), badHolder(900)}, `duplicate lock "l00003"`},
		{"repeat and bad holder in one lock", []func(*fsmv1.Snapshot){badHolder(800), dup(800, 10)}, `duplicate lock "l00010"`},
		{"bytes bad in a later batch", []func(*fsmv1.Snapshot){badBytes(1100)}, "decode snapshot"},
		{"bad holder before bad bytes", []func(*fsmv1.Snapshot){badHolder(1099), badBytes(1100)}, `lock "l01099": bad holder "s9"`},
		{"repeat before bad bytes", []func(*fsmv1.Snapshot){dup(300, 2), badBytes(1100)}, `duplicate lock "l00002"`},
		{"bad bytes before a bad holder", []func(*fsmv1.Snapshot){badBytes(300), badHolder(1100)}, "decode snapshot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := aheadSnapshot()
			for _, e := range tt.edits {
				e(s)
			}
			b := encodeSnapshot(t, s)
			if i := bytes.Index(b, []byte(marker)); i >= 0 {
				b[i] = 0xff // a string that is not UTF-8
			}
			f := initFSM(t, nil)
			mustOK(t, f, newSession("x"))
			mustOK(t, f, acq("x", 1, "x", excl, false))
			before := f.State()
			err := f.RestoreBytes(b)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %v, want one containing %q", err, tt.msg)
			}
			if after := f.State(); !proto.Equal(before, after) {
				t.Fatal("refused restore changed the state")
			}
		})
	}
}
