package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/lockd-dev/lockd/internal/wallclock"
)

// The audit log: one JSON object a line for every admin operation (with
// its outcome) and every refused call (no or unknown credentials, a
// permission not granted, a wrong session secret, a limit). The format is
// documented in docs/security.md; fields are only ever added. It never
// carries a secret or a token.

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	// Time is when the node decided (RFC 3339, UTC).
	Time time.Time `json:"time"`
	// Node is the id of the node that wrote the line.
	Node string `json:"node"`
	// Identity is the caller's identity ("" with authentication off or
	// without valid credentials).
	Identity string `json:"identity"`
	// ForwardedBy is the peer identity that forwarded the call, if any.
	ForwardedBy string `json:"forwarded_by,omitempty"`
	// Peer is the network address the call came from.
	Peer string `json:"peer"`
	// Op is the operation (the RPC name, or SnapshotSave).
	Op string `json:"op"`
	// Lock is the lock name or prefix concerned, if any.
	Lock string `json:"lock,omitempty"`
	// Member is the node id concerned (Join, RemoveMember,
	// TransferLeadership), if any.
	Member string `json:"member,omitempty"`
	// Outcome is "ok", "refused" (permission, authentication, limit) or
	// "error" (the operation was allowed and failed).
	Outcome string `json:"outcome"`
	// Code is the Connect error code ("" when ok).
	Code string `json:"code,omitempty"`
	// Reason is the error message ("" when ok).
	Reason string `json:"reason,omitempty"`
}

// auditLog writes AuditEntry lines to w. A nil *auditLog writes nothing.
type auditLog struct {
	node string
	mu   sync.Mutex
	w    io.Writer
}

func (l *auditLog) record(ctx context.Context, a *access, err error) {
	if l == nil {
		return
	}
	c := callerOf(ctx)
	e := AuditEntry{Time: wallclock.Now().UTC(), Node: l.node, Identity: c.identity, ForwardedBy: c.forwardedBy, Peer: c.addr, Outcome: "ok"}
	if a != nil {
		e.Op, e.Lock, e.Member = a.op, a.name, a.member
	}
	if err != nil {
		e.Outcome, e.Code = "error", connect.CodeOf(err).String()
		switch connect.CodeOf(err) {
		case connect.CodePermissionDenied, connect.CodeUnauthenticated, connect.CodeResourceExhausted:
			e.Outcome = "refused"
		}
		e.Reason = err.Error()
		var ce *connect.Error
		if errors.As(err, &ce) {
			e.Reason = ce.Message()
		}
	}
	b, jerr := json.Marshal(e)
	if jerr != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(b, '\n'))
}
