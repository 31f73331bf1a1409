package server

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// apiError builds a Connect error carrying an ErrorDetail, so clients map it
// back to a sentinel by reason without parsing the message.
func (s *Server) apiError(code connect.Code, reason lockdv1.ErrorReason, msg string, holders ...*lockdv1.Holder) *connect.Error {
	return s.detailError(code, msg, &lockdv1.ErrorDetail{Reason: reason, Holders: holders})
}

// detailError builds a Connect error carrying d, with the cluster id set.
func (s *Server) detailError(code connect.Code, msg string, d *lockdv1.ErrorDetail) *connect.Error {
	e := connect.NewError(code, errors.New(msg))
	d.ClusterId = s.fsm.ClusterID()
	if ed, err := connect.NewErrorDetail(d); err == nil {
		e.AddDetail(ed)
	}
	return e
}

// unavailable is the answer of a node that cannot serve a request now. It
// carries the leader's API URL when this node knows another node leads, so
// the client goes there directly instead of trying every endpoint.
func (s *Server) unavailable(reason lockdv1.ErrorReason, msg string) *connect.Error {
	return s.detailError(connect.CodeUnavailable, msg, &lockdv1.ErrorDetail{Reason: reason, LeaderApi: s.leaderHint()})
}

// leaderHint returns the API URL of the leader when another node leads and
// its URL is known, else "".
func (s *Server) leaderHint() string {
	id := s.heardLeader()
	if id == "" || string(id) == s.nodeID {
		return ""
	}
	if m, ok := s.fsm.Member(string(id)); ok {
		return m.API
	}
	return ""
}

func (s *Server) invalid(format string, args ...any) *connect.Error {
	return s.apiError(connect.CodeInvalidArgument, lockdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, fmt.Sprintf(format, args...))
}

// raftError maps Raft's errors in one place: not leader → unavailable with a
// leader hint; leadership lost mid-commit → outcome unknown, safe to retry
// with the same request id.
func (s *Server) raftError(err error) *connect.Error {
	switch {
	case errors.Is(err, errNoFreshQuorum):
		// Raft still names this node the leader; it could not show it.
		return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, fmt.Sprintf("node %s could not confirm it still leads (no quorum answered a heartbeat sent after the request arrived); retry", s.nodeID))
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		id := s.heardLeader()
		if id == "" {
			return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_NO_LEADER, "no leader elected; retry")
		}
		return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, fmt.Sprintf("node %s is not the leader (leader: %s); retry", s.nodeID, id))
	case errors.Is(err, raft.ErrLeadershipLost):
		return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN, "leadership lost while committing; outcome unknown, retry with the same request id")
	case errors.Is(err, raft.ErrRaftShutdown):
		return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, "node is shutting down; retry elsewhere")
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN, "raft apply timed out; outcome unknown, retry with the same request id")
	}
	return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN, "raft: "+err.Error())
}

// resultError maps a refused FSM command to an API error.
func (s *Server) resultError(r *fsm.Result) *connect.Error {
	switch r.Code {
	case fsm.CodeInvalid:
		return s.invalid("%s", r.Msg)
	case fsm.CodeSessionUnknown:
		return s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, r.Msg)
	case fsm.CodeRevoked:
		return s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED, r.Msg)
	case fsm.CodeBusy:
		return s.apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_BUSY, r.Msg, holdersPB(r.Holders)...)
	case fsm.CodeAlreadyHeld:
		return s.apiError(connect.CodeAlreadyExists, lockdv1.ErrorReason_ERROR_REASON_ALREADY_HELD, r.Msg)
	case fsm.CodeNotHeld:
		return s.apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_NOT_HELD, r.Msg)
	case fsm.CodeLimitMismatch:
		return s.apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH, r.Msg)
	case fsm.CodeAlreadyDone:
		d := &lockdv1.ErrorDetail{Reason: lockdv1.ErrorReason_ERROR_REASON_ALREADY_DONE}
		if r.Mark != nil {
			d.Mark = markPB(*r.Mark)
		}
		return s.detailError(connect.CodeFailedPrecondition, r.Msg, d)
	case fsm.CodeForbidden:
		return s.apiError(connect.CodePermissionDenied, lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, r.Msg)
	case fsm.CodeTooMany:
		return s.apiError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_TOO_MANY, r.Msg)
	case fsm.CodeIdentityLimit:
		s.metrics.limitHits.WithLabelValues("sessions").Inc()
		return s.apiError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED, r.Msg)
	case fsm.CodeDeadlock:
		return s.apiError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_DEADLOCK, r.Msg)
	case fsm.CodeCancelled:
		return s.apiError(connect.CodeAborted, lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED, "the acquire was cancelled before it arrived")
	case fsm.CodeNotInitialized:
		return s.unavailable(lockdv1.ErrorReason_ERROR_REASON_NO_LEADER, r.Msg)
	}
	return s.apiError(connect.CodeInternal, lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED, fmt.Sprintf("code %d: %s", r.Code, r.Msg))
}

func (s *Server) leaseError(err error) *connect.Error {
	switch {
	case errors.Is(err, lease.ErrNotActive):
		return s.raftError(raft.ErrNotLeader)
	case errors.Is(err, lease.ErrRevoked):
		return s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED, "session was force-released and will expire")
	}
	return s.apiError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session not found (expired or closed)")
}
