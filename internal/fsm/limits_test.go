package fsm_test

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// A session cannot hold or wait for more than MaxLocksPerSession locks: the
// next acquire is refused with CodeTooMany and changes nothing.
func TestTooManyLocksPerSession(t *testing.T) {
	f := fsm.New(nil)
	apply(t, f, &fsmv1.Init{ClusterId: "c", Epoch: epoch})
	apply(t, f, &fsmv1.CreateSession{SessionId: "s", TtlMs: 10000})
	for i := range fsm.MaxLocksPerSession {
		apply(t, f, &fsmv1.Acquire{SessionId: "s", Seq: uint64(i + 1), Ack: uint64(i + 1), Name: fmt.Sprint("l", i), Mode: excl})
	}
	b, _ := fsm.Encode(fsm.CmdAcquire, &fsmv1.Acquire{SessionId: "s", Seq: fsm.MaxLocksPerSession + 1, Ack: fsm.MaxLocksPerSession + 1, Name: "one-more", Mode: excl})
	if r := f.ApplyCommand(b); r.Code != fsm.CodeTooMany {
		t.Fatalf("acquire past the limit: %+v, want CodeTooMany", r)
	}
	if _, ok := f.Describe("one-more"); ok {
		t.Fatal("refused acquire created the lock")
	}
}
