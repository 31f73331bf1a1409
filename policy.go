package lockd

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/internal/wire"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// LockPolicy is an admin's rule for one lock name, replicated with the lock
// table and kept while the lock has no holder (docs/lock-semantics.md).
// A zero field is no rule.
type LockPolicy struct {
	// DefaultMaxHold is the hold budget of an acquire that asks none
	// (WithMaxHold): 0 or 1 s to 720 h.
	DefaultMaxHold time.Duration
	// RevokeGrace is how long a holder asked to let go by an admin
	// (RequestRelease by a caller with admin permission on the lock) has
	// before the server revokes its session, as a force-release does: the
	// lease then runs out and only then is the lock granted to anyone else.
	// 0 or 1 s to 1 h.
	RevokeGrace time.Duration
}

// SetLockPolicy sets lock name's policy (admin permission); the zero
// LockPolicy removes it. Holds granted before keep the budget they got; a
// new RevokeGrace applies to the requests made after it. Errors match
// ErrInvalidArgument (a bad name or duration), ErrPermissionDenied or
// ErrUnavailable.
func (c *Client) SetLockPolicy(ctx context.Context, name string, p LockPolicy) error {
	msg := &lockdv1.SetLockPolicyRequest{Name: name}
	if p != (LockPolicy{}) {
		msg.Policy = &lockdv1.LockPolicy{DefaultMaxHold: durationOrNil(p.DefaultMaxHold), RevokeGrace: durationOrNil(p.RevokeGrace)}
	}
	if _, err := wire.SetLockPolicy.Invoke(ctx, c.call, wire.SetLockPolicy.PolicyOf(msg), msg, nil); err != nil {
		return fmt.Errorf("set policy of %q: %w", name, err)
	}
	return nil
}

// RequestReleaseResult is what RequestRelease did.
type RequestReleaseResult struct {
	// Holders is the number of holds asked (0: the lock had no holder).
	Holders int
	// RevokeGrace is set when the request was an admin's on a lock whose
	// policy has a revoke grace: each hold asked is revoked that long after
	// it was first given the grace, unless it ends first. 0: the holders
	// are only asked.
	RevokeGrace time.Duration
}

// RequestRelease asks the holders of lock name to let go, for reason (at
// most 256 bytes), and changes nothing else: the request is recorded on
// each hold (DescribeLock shows it), seen by every watcher of the lock
// (EventReleaseRequested) and delivered to the holders that listen for it.
// A holder is free to ignore it, unless the caller has admin permission on
// the lock and the lock's policy has a RevokeGrace: then the holder's
// session is revoked once the grace ran out. A repeated request does not
// restart a grace. Calling it needs lock permission on name.
func (c *Client) RequestRelease(ctx context.Context, name, reason string) (RequestReleaseResult, error) {
	msg := &lockdv1.RequestReleaseRequest{Name: name, Reason: reason}
	resp, err := wire.RequestRelease.Invoke(ctx, c.call, wire.RequestRelease.PolicyOf(msg), msg, nil)
	if err != nil {
		return RequestReleaseResult{}, fmt.Errorf("request release of %q: %w", name, err)
	}
	return RequestReleaseResult{Holders: int(resp.Msg.GetHolders()), RevokeGrace: resp.Msg.GetRevokeGrace().AsDuration()}, nil
}

// durationOrNil is d for a request, nil for 0.
func durationOrNil(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}
