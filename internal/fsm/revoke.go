package fsm

import (
	"fmt"
	"slices"
	"strings"
	"time"

	fsmv1 "github.com/lockd-dev/lockd/proto/lockd/fsm/v1"
)

// Cooperative revocation. RequestRelease asks a lock's holders to let go:
// one EventReleaseAsked per hold (its session and token, the reason as the
// value), which every watcher of the lock sees and the holder's session
// stream delivers. A hold records its first request (ask), so a client that
// subscribes later still learns of it. When the asker is an admin and the
// lock's policy has a revoke grace, the hold also records that grace and
// the event carries it: the leader's timer then proposes RevokeHold, which
// revokes the holder's session, as a force-release does, if that very hold
// is still there. A new leader restarts every grace in full, so the server
// revokes only later than the holder was told, never earlier.

// MaxReasonBytes bounds a RequestRelease's reason.
const MaxReasonBytes = 256

// MinRevokeGraceMs and MaxRevokeGraceMs bound a lock policy's revoke grace.
const (
	MinRevokeGraceMs = 1000
	MaxRevokeGraceMs = 3600 * 1000
)

// ValidateRequestRelease reports why Apply refuses c for its fields alone:
// the name, and a reason over MaxReasonBytes.
func ValidateRequestRelease(c *fsmv1.RequestRelease) error {
	if err := ValidateName(c.Name); err != nil {
		return err
	}
	if len(c.Reason) > MaxReasonBytes {
		return fmt.Errorf("reason is %d bytes, more than %d", len(c.Reason), MaxReasonBytes)
	}
	return nil
}

func checkGraceMs(g int64) error {
	if g != 0 && (g < MinRevokeGraceMs || g > MaxRevokeGraceMs) {
		return fmt.Errorf("revoke grace %d ms is outside [%d, %d]", g, MinRevokeGraceMs, MaxRevokeGraceMs)
	}
	return nil
}

// checkAsk reports why a snapshot hold's release request is not one Apply
// makes.
func checkAsk(ph *fsmv1.Hold) error {
	switch {
	case !ph.Asked && (ph.AskedUnixNano != 0 || ph.AskedReason != "" || ph.RevokeGraceMs != 0 || ph.GraceUnixNano != 0),
		ph.RevokeGraceMs == 0 && ph.GraceUnixNano != 0:
		return fmt.Errorf("release request fields without a request")
	case len(ph.AskedReason) > MaxReasonBytes:
		return fmt.Errorf("release reason of %d bytes", len(ph.AskedReason))
	}
	return checkGraceMs(ph.RevokeGraceMs)
}

func (f *FSM) applyRequestRelease(c *fsmv1.RequestRelease) *Result {
	if err := ValidateRequestRelease(c); err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	l := f.locks[c.Name]
	if l == nil {
		return &Result{}
	}
	var grace, started int64
	if p := f.policies[c.Name]; p != nil && c.Admin {
		grace = p.revokeGraceMs
	}
	for _, h := range l.holders { // token order
		e := f.event(EventReleaseAsked, l, h.session, h.token, h.mode, []byte(c.Reason))
		if h.ask == nil {
			h.ask = &holdAsk{at: c.TimeUnixNano, reason: c.Reason}
		}
		if grace > 0 && h.ask.graceMs == 0 {
			// The leader's timer starts with this event.
			h.ask.graceMs, h.ask.graceAt, started = grace, c.TimeUnixNano, grace
			if e != nil {
				e.DurationMs = grace
			}
		}
	}
	return &Result{Holders: f.holderInfos(l), MaxHold: ms(started)}
}

// applyRevokeHold revokes the session of the hold c names (lock, session,
// token) when that hold is still there; a late or repeated RevokeHold never
// touches a newer grant or a session that let go.
func (f *FSM) applyRevokeHold(c *fsmv1.RevokeHold, term uint64) *Result {
	if c.Term != 0 && term != 0 && c.Term != term {
		return fail(CodeInvalid, "stale revocation decided in term %d, committed in term %d", c.Term, term)
	}
	l := f.locks[c.Name]
	if l == nil {
		return &Result{}
	}
	i := slices.IndexFunc(l.holders, func(h *hold) bool { return h.token == c.Token })
	if i < 0 || l.holders[i].session != c.SessionId || f.sessions[c.SessionId].revoked {
		return &Result{} // GrantedAt zero: nothing revoked by this command
	}
	h := l.holders[i]
	f.applyRevokeSession(&fsmv1.RevokeSession{SessionIds: []string{c.SessionId}, TimeUnixNano: c.TimeUnixNano})
	return &Result{GrantedAt: time.Unix(0, h.granted)}
}

// WithRevokeGraces calls fn with every hold whose revoke grace runs (its
// session not revoked yet), by lock name and token, the grace in
// Budget.MaxHold, while no command can be applied (see WithSessions).
func (f *FSM) WithRevokeGraces(fn func([]Budget)) {
	f.withHoldTimers(func(h *hold) int64 {
		if h.ask == nil || f.sessions[h.session].revoked {
			return 0
		}
		return h.ask.graceMs
	}, fn)
}

// ReleaseAsk is a hold's pending release request, for its session's
// notices.
type ReleaseAsk struct {
	Name   string
	Token  uint64
	Reason string
	At     time.Time
	// Grace is the revoke grace (0: none), counted from GraceFrom.
	Grace     time.Duration
	GraceFrom time.Time
}

// ReleaseAsks returns the pending release requests of the holds of session
// id, by lock name (the caller checks the session's secret).
func (f *FSM) ReleaseAsks(id string) (asks []ReleaseAsk) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.sessions[id]
	if s == nil {
		return nil
	}
	for name, h := range s.holds {
		if a := h.ask; a != nil {
			asks = append(asks, ReleaseAsk{Name: name, Token: h.token, Reason: a.reason, At: time.Unix(0, a.at), Grace: ms(a.graceMs), GraceFrom: time.Unix(0, a.graceAt)})
		}
	}
	slices.SortFunc(asks, func(a, b ReleaseAsk) int { return strings.Compare(a.Name, b.Name) })
	return asks
}
