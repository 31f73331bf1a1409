package guard

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
//
// Refusals by a per-identity limit are aggregated: a flood of them would
// otherwise cost the node a JSON encoding and a write(2) per refused call
// (a tenth of its CPU under acceptance 5's flood), the very cost the limit
// is there to bound. The first refusal of an identity and operation gets
// its own line at once; the next ones within auditWindow are counted and
// written as one line with "count" when the window ends (or when the log
// closes). Every other line, admin operations included, is written as it
// happens.

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
	// Op is the operation (the RPC name, or SnapshotSave; HostCheck for a
	// request refused by its Host or Origin header, Connection for a
	// connection over its source's cap, both aggregated per client
	// address like limit refusals).
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
	// Count, when set, is the number of limit refusals of Identity and Op
	// this line stands for: the ones after the line written for the first
	// refusal, from Since to Time. Lock, Peer, Code and Reason are those of
	// the first refusal counted.
	Count int `json:"count,omitempty"`
	// Since is when the first refusal counted in Count was decided.
	Since *time.Time `json:"since,omitempty"`
}

// auditWindow is how long the limit refusals of one identity and operation
// after a first one are counted into one line.
const auditWindow = time.Second

// maxAuditWindows bounds the windows open at once (distinct identities,
// operations and, with authentication off, client addresses); beyond it
// each refusal gets its own line.
const maxAuditWindows = 4096

// windowKey names the limit refusals counted together.
type windowKey struct {
	identity, op string
	host         string // with authentication off (identity ""): the client's
}

// window counts the limit refusals of one key after its first line.
type window struct {
	first AuditEntry // the first refusal counted
	count int
	timer *time.Timer
}

// auditLog writes AuditEntry lines to w. A nil *auditLog writes nothing.
type auditLog struct {
	node string
	mu   sync.Mutex
	w    io.Writer

	windows map[windowKey]*window // open windows of limit refusals (under mu)
	closed  bool                  // flush ran: count nothing more
}

func (l *auditLog) record(ctx context.Context, a *access, err error) {
	if l == nil {
		return
	}
	e := l.entry(ctx, a, err)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.write(e)
}

// limitRefused records a call refused by a per-identity limit: a line of
// its own for the first of its identity and operation, else counted in the
// open window's line.
func (l *auditLog) limitRefused(ctx context.Context, a *access, err error) {
	if l == nil {
		return
	}
	c := callerOf(ctx)
	k := windowKey{identity: c.identity}
	if a != nil {
		k.op = a.op
	}
	if c.identity == "" {
		k.host = hostOf(c.addr)
	}
	l.aggregate(k, func() AuditEntry { return l.entry(ctx, a, err) })
}

// netRefused records a request or connection refused before it became a
// call (a foreign Host header, a connection over its source's cap),
// aggregated per operation and client address like limitRefused.
func (l *auditLog) netRefused(peer, op, code, reason string) {
	if l == nil {
		return
	}
	l.aggregate(windowKey{op: op, host: hostOf(peer)}, func() AuditEntry {
		return AuditEntry{Time: wallclock.Now().UTC(), Node: l.node, Peer: peer, Op: op, Outcome: "refused", Code: code, Reason: reason}
	})
}

// aggregate writes the line of a refusal of key k (entry makes it) at
// once if it is the first of its window, else counts it in the window.
func (l *auditLog) aggregate(k windowKey, entry func() AuditEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.windows[k]; w != nil {
		if w.count == 0 {
			w.first = entry()
		}
		w.count++
		return
	}
	if !l.closed && len(l.windows) < maxAuditWindows {
		if l.windows == nil {
			l.windows = map[windowKey]*window{}
		}
		w := &window{}
		w.timer = time.AfterFunc(auditWindow, func() { l.endWindow(k, w) })
		l.windows[k] = w
	}
	l.write(entry())
}

// endWindow writes the line of a window's refusals, if any.
func (l *auditLog) endWindow(k windowKey, w *window) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.windows[k] != w {
		return // flushed
	}
	delete(l.windows, k)
	l.writeCount(w)
}

func (l *auditLog) writeCount(w *window) {
	if w.count == 0 {
		return
	}
	e := w.first
	since := e.Time
	e.Time, e.Since, e.Count = wallclock.Now().UTC(), &since, w.count
	l.write(e)
}

// flush writes the lines of the open windows and counts nothing more
// (every later limit refusal gets its own line): the log is closing.
func (l *auditLog) flush() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for k, w := range l.windows {
		w.timer.Stop()
		delete(l.windows, k)
		l.writeCount(w)
	}
}

// entry makes the line of one call.
func (l *auditLog) entry(ctx context.Context, a *access, err error) AuditEntry {
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
	return e
}

// write writes one line; l.mu is held.
func (l *auditLog) write(e AuditEntry) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	_, _ = l.w.Write(append(b, '\n'))
}
