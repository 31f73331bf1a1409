package fsm_test

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// filledFSM returns an FSM holding n exclusive locks named fill/%07d,
// spread over sessions of at most 10 000 holds each (below
// MaxLocksPerSession).
func filledFSM(b testing.TB, n int) *fsm.FSM {
	b.Helper()
	f := initFSM(b, nil)
	seq := map[string]uint64{}
	for i := range n {
		s := fmt.Sprintf("fill%02d", i/10_000)
		if seq[s] == 0 {
			mustOK(b, f, newSession(s))
		}
		seq[s]++
		a := acq(s, seq[s], fmt.Sprintf("fill/%07d", i), excl, false)
		a.Ack = seq[s]
		mustOK(b, f, a)
	}
	return f
}

// BenchmarkApplyAcquireRelease: one op is an Acquire that creates a lock and
// the Release that deletes it (two Apply calls, encoding included), beside
// 0 or 100 000 other locks: what the lock table's upkeep costs per command.
func BenchmarkApplyAcquireRelease(b *testing.B) {
	for _, n := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) {
			f := filledFSM(b, n)
			mustOK(b, f, newSession("s"))
			b.ReportAllocs()
			seq := uint64(0)
			for b.Loop() {
				seq++
				name := fmt.Sprintf("fill/%07d-b%d", (seq*7919)%uint64(max(n, 1)), seq%8)
				a := acq("s", seq, name, excl, false)
				a.Ack = seq
				r := f.ApplyCommand(cmd(b, a))
				if r.Code != fsm.OK {
					b.Fatalf("acquire: %+v", r)
				}
				seq++
				r = f.ApplyCommand(cmd(b, &fsmv1.Release{SessionId: "s", Seq: seq, Ack: seq, Name: name, Token: r.Token}))
				if r.Code != fsm.OK {
					b.Fatalf("release: %+v", r)
				}
			}
		})
	}
}

// BenchmarkList: one page of ListLocks (page size 1 and 100) among 100 000
// locks, on a prefix that matches them all and one that matches none.
func BenchmarkList(b *testing.B) {
	f := filledFSM(b, 100_000)
	for _, c := range []struct {
		prefix string
		n      int
	}{{"fill/", 1}, {"fill/", 100}, {"none/", 1}} {
		b.Run(fmt.Sprintf("prefix=%s/page=%d", c.prefix, c.n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f.List(c.prefix, "fill/0050000", c.n)
			}
		})
	}
}

// TestListCostIndependentOfTableSize: a page of List, and a watch's state
// dump of a prefix with one lock, allocate the same among 10 locks as
// among 10 000 — they no longer copy and sort every name under the read
// lock (before the name index, the copy grew with the table). Allocations,
// not time, so the test is exact on a busy machine.
func TestListCostIndependentOfTableSize(t *testing.T) {
	small, big := filledFSM(t, 10), filledFSM(t, 10_000)
	for _, f := range []*fsm.FSM{small, big} {
		mustOK(t, f, newSession("w"))
		mustOK(t, f, acq("w", 1, "zz/one", excl, false))
	}
	cost := func(f *fsm.FSM) (list, none, dump float64) {
		list = testing.AllocsPerRun(20, func() { f.List("fill/", "fill/0000005", 1) })
		none = testing.AllocsPerRun(20, func() { f.List("nothing/", "", 1) })
		dump = testing.AllocsPerRun(20, func() { f.Holding("zz/", func([]fsm.Event) {}) })
		return
	}
	sl, sn, sd := cost(small)
	bl, bn, bd := cost(big)
	if sl != bl || sn != bn || sd != bd {
		t.Errorf("allocations (page, empty prefix, state dump): %v %v %v among 10 locks, %v %v %v among 10 000; want the same", sl, sn, sd, bl, bn, bd)
	}
}
