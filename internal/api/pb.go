package api

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lockd-dev/lockd/internal/fsm"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// This file converts the FSM's read views to API messages.

// SessionPB converts a session's read view.
func SessionPB(x fsm.SessionInfo) *lockdv1.SessionInfo {
	return &lockdv1.SessionInfo{
		SessionId: x.ID, Owner: x.Owner, Ttl: durationpb.New(x.TTL),
		CreatedAt: timestamppb.New(x.CreatedAt), Holds: uint32(x.Holds), Waits: uint32(x.Waits), Revoked: x.Revoked,
		Identity: x.Identity,
	}
}

// HoldersPB converts holders' read views.
func HoldersPB(hs []fsm.HolderInfo) []*lockdv1.Holder {
	out := make([]*lockdv1.Holder, len(hs))
	for i, h := range hs {
		out[i] = &lockdv1.Holder{SessionId: h.Session, Mode: lockdv1.Mode(h.Mode), Token: h.Token, GrantedAt: timestamppb.New(h.GrantedAt), Value: h.Value, Owner: h.Owner, MaxHold: BudgetPB(h.MaxHold),
			ReleaseReason: h.ReleaseReason, RevokeGrace: BudgetPB(h.RevokeGrace)}
		if !h.ReleaseRequestedAt.IsZero() {
			out[i].ReleaseRequestedAt = timestamppb.New(h.ReleaseRequestedAt)
		}
		if !h.RevokeGraceFrom.IsZero() {
			out[i].RevokeGraceFrom = timestamppb.New(h.RevokeGraceFrom)
		}
	}
	return out
}

// MarkPB converts a completion mark.
func MarkPB(m fsm.Mark) *lockdv1.Mark {
	return &lockdv1.Mark{SessionId: m.Session, Owner: m.Owner, Token: m.Token,
		CompletedAt: timestamppb.New(m.CompletedAt), Retention: durationpb.New(m.Retention)}
}

// LockPB converts a lock's read view.
func LockPB(l fsm.LockInfo) *lockdv1.LockInfo {
	li := &lockdv1.LockInfo{Name: l.Name, Limit: l.Limit, Holders: HoldersPB(l.Holders)}
	if l.Mark != nil {
		li.Mark = MarkPB(*l.Mark)
	}
	if l.Delay > 0 {
		li.LockDelay = durationpb.New(l.Delay)
		li.Delayed = l.Delayed
	}
	for _, w := range l.Waiters {
		li.Waiters = append(li.Waiters, &lockdv1.Waiter{SessionId: w.Session, Mode: lockdv1.Mode(w.Mode), QueuedAt: timestamppb.New(w.QueuedAt), Owner: w.Owner})
	}
	return li
}

// BudgetPB is a grant's budget for an answer, nil for none.
func BudgetPB(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}
