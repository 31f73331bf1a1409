package fsm_test

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// BenchmarkQueueBehindWaiters: one op is a queued Acquire (with the
// deadlock check) and its Cancel, on a lock with n waiters queued before
// it, each its own session: what the waits-for walk costs on a long queue
// (check=true) against the same without the deadlock check.
func BenchmarkQueueBehindWaiters(b *testing.B) {
	for _, n := range []int{10, 1000, 10_000} {
		for _, check := range []bool{false, true} {
			benchQueueBehind(b, n, check)
		}
	}
}

func benchQueueBehind(b *testing.B, n int, check bool) {
	{
		b.Run(fmt.Sprintf("waiters=%d/check=%v", n, check), func(b *testing.B) {
			f := initFSM(b, nil)
			mustOK(b, f, newSession("holder"))
			mustOK(b, f, acq("holder", 1, "hot", excl, false))
			for i := range n {
				s := fmt.Sprintf("w%05d", i)
				mustOK(b, f, newSession(s))
				a := acq(s, 1, "hot", excl, true)
				a.RefuseDeadlock = true
				if r := f.ApplyCommand(cmd(b, a)); r.Code != fsm.OK {
					b.Fatalf("queue %d: %+v", i, r)
				}
			}
			mustOK(b, f, newSession("s"))
			b.ReportAllocs()
			seq := uint64(0)
			for b.Loop() {
				seq++
				a := acq("s", seq, "hot", excl, true)
				a.Ack, a.RefuseDeadlock = seq, check
				if r := f.ApplyCommand(cmd(b, a)); r.Code != fsm.OK {
					b.Fatalf("queue: %+v", r)
				}
				seq++
				if r := f.ApplyCommand(cmd(b, &fsmv1.Cancel{SessionId: "s", Seq: seq, Ack: seq, Name: "hot", AcquireSeq: seq - 1})); r.Code != fsm.OK {
					b.Fatalf("cancel: %+v", r)
				}
			}
		})
	}
}
