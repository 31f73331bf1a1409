package api

import (
	"errors"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// The LockService handlers live in api_session.go (sessions), api_lock.go
// (lock writes) and api_read.go (reads), each exported method beside its
// body. An exported method serves a request on the leader, forwarding it
// there from a follower (viaLeader); stale reads are served by any node from
// its own state. This file holds what they share.

// api implements lockdv1connect.LockServiceHandler.
type api struct{ s *Server }

func (a *api) clusterID() string { return a.s.fsm.ClusterID() }

// propose proposes a command and maps both Raft and FSM refusals. The
// result is returned with an FSM refusal too (what Apply knew), nil only
// when the command was not applied.
func (a *api) propose(t fsm.CmdType, m proto.Message) (*fsm.Result, error) {
	r, err := a.s.node.Propose(t, m)
	if err != nil {
		return nil, a.s.errs.RaftError(err)
	}
	if r.Code != fsm.OK {
		return r, a.s.errs.ResultError(r)
	}
	return r, nil
}

func (a *api) read(c lockdv1.ReadConsistency) error {
	if c == lockdv1.ReadConsistency_READ_CONSISTENCY_STALE {
		return nil
	}
	if err := a.s.node.Linearizable(); err != nil {
		if errors.Is(err, raft.ErrRaftShutdown) {
			// Before any proposal: certainly not done.
			return a.s.errs.Unavailable(lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, "node is shutting down; retry elsewhere")
		}
		return a.s.errs.RaftError(err)
	}
	return nil
}

// checkRequest checks what every session-scoped lock call carries, and
// refuses a session without a secret (refuseSecretless).
func (a *api) checkRequest(session string, seq uint64) error {
	if session == "" {
		return a.s.errs.Invalid("session_id is required")
	}
	if seq == 0 {
		return a.s.errs.Invalid("seq must be positive (per-session request sequence number)")
	}
	return a.s.refuseSecretless(session)
}
