package fsm_test

import (
	"fmt"
	"testing"

	"github.com/lockd-dev/lockd/internal/fsm"
	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// TestApplyIdentitySessionsCap: Apply refuses a session of an identity at
// the cap its command carries, counting the sessions applied before it
// (which all passed the leader's check together); a retry of a created
// session is still answered, other identities and commands without a cap
// are not affected, a closed session frees a place, and the count
// survives a snapshot round trip.
func TestApplyIdentitySessionsCap(t *testing.T) {
	f := initFSM(t, nil)
	create := func(f *fsm.FSM, id, identity string, limit uint32) *fsm.Result {
		c := newSession(id)
		c.RequestId, c.Identity, c.IdentitySessionsCap = "req-"+id, identity, limit
		return apply(t, f, c)
	}
	for i := range 3 {
		if r := create(f, fmt.Sprintf("a%d", i), "alice", 3); r.Code != fsm.OK {
			t.Fatalf("session %d of alice: %+v", i, r)
		}
	}
	if r := create(f, "a3", "alice", 3); r.Code != fsm.CodeIdentityLimit {
		t.Fatalf("fourth session of alice (cap 3): %+v, want CodeIdentityLimit", r)
	}
	if r := create(f, "a0", "alice", 3); r.Code != fsm.OK || !r.Duplicate {
		t.Fatalf("retry of alice's first session at the cap: %+v, want the duplicate answer", r)
	}
	if r := create(f, "b0", "bob", 3); r.Code != fsm.OK {
		t.Fatalf("bob while alice is at her cap: %+v", r)
	}
	if r := create(f, "a4", "alice", 0); r.Code != fsm.OK {
		t.Fatalf("alice without a cap in the command: %+v", r)
	}
	g := fsm.New(nil)
	if err := g.Load(f.State()); err != nil {
		t.Fatal(err)
	}
	if r := create(g, "a5", "alice", 4); r.Code != fsm.CodeIdentityLimit {
		t.Fatalf("after a snapshot round trip, alice (4 sessions, cap 4): %+v, want CodeIdentityLimit", r)
	}
	if r := apply(t, g, &fsmv1.CloseSession{SessionId: "a1", Seq: 1, Identity: "alice"}); r.Code != fsm.OK {
		t.Fatal(r)
	}
	if r := create(g, "a6", "alice", 4); r.Code != fsm.OK {
		t.Fatalf("alice after closing a session: %+v", r)
	}
}
