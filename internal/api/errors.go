package api

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/lease"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Errors maps the node's, the FSM's and the lease timers' errors to Connect
// errors carrying an ErrorDetail (the reason a client maps back to a
// sentinel, the cluster id, the leader hint), in one place.
type Errors struct {
	node      Node
	fsm       *fsm.FSM
	nodeID    string
	limitHits *prometheus.CounterVec // lockd_limit_hits_total, by reason
}

// NewErrors returns the error mapping of node n (id nodeID, state machine
// f); limitHits counts the refusals by a per-identity limit.
func NewErrors(n Node, f *fsm.FSM, nodeID string, limitHits *prometheus.CounterVec) *Errors {
	return &Errors{node: n, fsm: f, nodeID: nodeID, limitHits: limitHits}
}

// APIError builds a Connect error carrying an ErrorDetail, so clients map it
// back to a sentinel by reason without parsing the message.
func (s *Errors) APIError(code connect.Code, reason lockdv1.ErrorReason, msg string, holders ...*lockdv1.Holder) *connect.Error {
	return s.DetailError(code, msg, &lockdv1.ErrorDetail{Reason: reason, Holders: holders})
}

// DetailError builds a Connect error carrying d, with the cluster id set.
func (s *Errors) DetailError(code connect.Code, msg string, d *lockdv1.ErrorDetail) *connect.Error {
	e := connect.NewError(code, errors.New(msg))
	d.ClusterId = s.fsm.ClusterID()
	if ed, err := connect.NewErrorDetail(d); err == nil {
		e.AddDetail(ed)
	}
	return e
}

// Unavailable is the answer of a node that cannot serve a request now. It
// carries the leader's API URL when this node knows another node leads, so
// the client goes there directly instead of trying every endpoint.
func (s *Errors) Unavailable(reason lockdv1.ErrorReason, msg string) *connect.Error {
	return s.DetailError(connect.CodeUnavailable, msg, &lockdv1.ErrorDetail{Reason: reason, LeaderApi: s.LeaderHint()})
}

// LeaderHint returns the API URL of the leader when another node leads and
// its URL is known, else "".
func (s *Errors) LeaderHint() string {
	id := s.node.HeardLeader()
	if id == "" || string(id) == s.nodeID {
		return ""
	}
	if m, ok := s.fsm.Member(string(id)); ok {
		return m.API
	}
	return ""
}

// Invalid is an INVALID_ARGUMENT error with a formatted message.
func (s *Errors) Invalid(format string, args ...any) *connect.Error {
	return s.APIError(connect.CodeInvalidArgument, lockdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, fmt.Sprintf(format, args...))
}

// RaftError maps Raft's errors in one place: not leader → unavailable with a
// leader hint; leadership lost mid-commit, a shutdown or a timeout →
// outcome unknown, safe to retry with the same request id.
func (s *Errors) RaftError(err error) *connect.Error {
	var upgrade *node.UpgradeRequiredError
	switch {
	case errors.As(err, &upgrade):
		return s.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_UPGRADE_REQUIRED, upgrade.Error())
	case errors.Is(err, node.ErrNoFreshQuorum):
		// Raft still names this node the leader; it could not show it.
		return s.Unavailable(lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, fmt.Sprintf("node %s could not confirm it still leads (no quorum answered a heartbeat sent after the request arrived); retry", s.nodeID))
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		id := s.node.HeardLeader()
		if id == "" {
			return s.Unavailable(lockdv1.ErrorReason_ERROR_REASON_NO_LEADER, "no leader elected; retry")
		}
		return s.Unavailable(lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER, fmt.Sprintf("node %s is not the leader (leader: %s); retry", s.nodeID, id))
	}
	return s.Unavailable(lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN, unknownOutcome(err))
}

// unknownOutcome is the message of every other Raft error: after each, an
// entry proposed may still commit. Never NOT_LEADER for these (a shutdown
// included): clients take that for "not done" and retry even a call that
// is not idempotent.
func unknownOutcome(err error) string {
	switch {
	case errors.Is(err, raft.ErrLeadershipLost):
		return "leadership lost while committing; outcome unknown, retry with the same request id"
	case errors.Is(err, raft.ErrRaftShutdown):
		return "node is shutting down; outcome unknown, retry elsewhere with the same request id"
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return "raft apply timed out; outcome unknown, retry with the same request id"
	}
	return "raft: " + err.Error()
}

// ResultError maps a refused FSM command to an API error.
func (s *Errors) ResultError(r *fsm.Result) *connect.Error {
	switch r.Code {
	case fsm.CodeInvalid:
		return s.Invalid("%s", r.Msg)
	case fsm.CodeSessionUnknown:
		return s.APIError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, r.Msg)
	case fsm.CodeRevoked:
		return s.APIError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED, r.Msg)
	case fsm.CodeBusy:
		return s.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_BUSY, r.Msg, HoldersPB(r.Holders)...)
	case fsm.CodeAlreadyHeld:
		return s.APIError(connect.CodeAlreadyExists, lockdv1.ErrorReason_ERROR_REASON_ALREADY_HELD, r.Msg)
	case fsm.CodeNotHeld:
		return s.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_NOT_HELD, r.Msg)
	case fsm.CodeLimitMismatch:
		return s.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH, r.Msg)
	case fsm.CodeAlreadyDone:
		d := &lockdv1.ErrorDetail{Reason: lockdv1.ErrorReason_ERROR_REASON_ALREADY_DONE}
		if r.Mark != nil {
			d.Mark = MarkPB(*r.Mark)
		}
		return s.DetailError(connect.CodeFailedPrecondition, r.Msg, d)
	case fsm.CodeForbidden:
		return s.APIError(connect.CodePermissionDenied, lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, r.Msg)
	case fsm.CodeTooMany:
		return s.APIError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_TOO_MANY, r.Msg)
	case fsm.CodeIdentityLimit:
		s.limitHits.WithLabelValues("sessions").Inc()
		return s.APIError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED, r.Msg)
	case fsm.CodeDeadlock:
		return s.APIError(connect.CodeFailedPrecondition, lockdv1.ErrorReason_ERROR_REASON_DEADLOCK, r.Msg)
	case fsm.CodeCancelled:
		return s.APIError(connect.CodeAborted, lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED, "the acquire was cancelled before it arrived")
	case fsm.CodeNotInitialized:
		return s.Unavailable(lockdv1.ErrorReason_ERROR_REASON_NO_LEADER, r.Msg)
	}
	return s.APIError(connect.CodeInternal, lockdv1.ErrorReason_ERROR_REASON_UNSPECIFIED, fmt.Sprintf("code %d: %s", r.Code, r.Msg))
}

// LeaseError maps a lease manager's refusal of a KeepAlive.
func (s *Errors) LeaseError(err error) *connect.Error {
	switch {
	case errors.Is(err, lease.ErrNotActive):
		return s.RaftError(raft.ErrNotLeader)
	case errors.Is(err, lease.ErrRevoked):
		return s.APIError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED, "session was force-released and will expire")
	}
	return s.APIError(connect.CodeNotFound, lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session not found (expired or closed)")
}
