package api

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// heardNone is a node that knows no leader: only HeardLeader is called
// while these errors are mapped. A fake, because a node shut down in the
// middle of a commit is not a state a real one reaches on demand.
type heardNone struct{ Node }

func (heardNone) HeardLeader() raft.ServerID { return "" }

// TestRaftErrorOutcomeUnknown: every Raft error after which a proposed
// entry may still commit (a shutdown too) maps to OUTCOME_UNKNOWN, never to
// NOT_LEADER, which clients take for "not done" and retry even when the
// call is not idempotent; ErrNotLeader still maps to "not done".
func TestRaftErrorOutcomeUnknown(t *testing.T) {
	e := NewErrors(heardNone{}, fsm.New(nil), "n1", nil)
	if r := reasonOf(e.RaftError(raft.ErrNotLeader)); r != lockdv1.ErrorReason_ERROR_REASON_NO_LEADER {
		t.Fatalf("ErrNotLeader: %v", r)
	}
	for _, err := range []error{raft.ErrRaftShutdown, raft.ErrLeadershipLost, raft.ErrEnqueueTimeout, fmt.Errorf("wrapped: %w", raft.ErrRaftShutdown), errors.New("disk on fire")} {
		ce := e.RaftError(err)
		if ce.Code() != connect.CodeUnavailable {
			t.Errorf("%v: code %v", err, ce.Code())
		}
		if r := reasonOf(ce); r != lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN {
			t.Errorf("%v: reason %v, want OUTCOME_UNKNOWN", err, r)
		}
	}
}

func reasonOf(ce *connect.Error) lockdv1.ErrorReason {
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if ed, ok := v.(*lockdv1.ErrorDetail); ok {
				return ed.Reason
			}
		}
	}
	return 0
}
