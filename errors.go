package lockd

import (
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"

	"github.com/lockd-dev/lockd/internal/wire"
)

// Sentinel errors. Every error a call returns can be tested with errors.Is
// against these; errors that came from the server also wrap the
// *connect.Error, so errors.As(err, &connectErr) keeps working.
var (
	// ErrNotHeld means the lock is not held: Unlock of a lock this handle does
	// not hold, or a release the server refused because the token is no
	// longer a current grant of the session. A held lock's Err returns it
	// after Unlock.
	ErrNotHeld = errors.New("lockd: lock not held")

	// ErrLeaseLost means the session's lease is gone (or may be gone): the
	// client-side deadline passed without a confirmed KeepAlive, or the
	// server no longer knows the session (expired, closed or force-released).
	// Every lock the session held must be assumed taken by someone else.
	ErrLeaseLost = errors.New("lockd: lease lost")

	// ErrBusy means the lock is not free and the call did not wait
	// (TryLock). The error is a *BusyError listing the holders.
	ErrBusy = errors.New("lockd: lock busy")

	// ErrAlreadyHeld means the session already holds the lock, or already
	// waits for it. lockd locks are not re-entrant.
	ErrAlreadyHeld = errors.New("lockd: lock already held or waited for by this session")

	// ErrLimitMismatch means the lock exists with a different limit (number
	// of permits) than the request asked for, for example a semaphore of 3
	// and one of 5 under the same name.
	ErrLimitMismatch = errors.New("lockd: lock limit mismatch")

	// ErrInvalidArgument means a request was refused as invalid (a bad lock
	// name, TTL out of bounds, an oversized value, ...), by the server or
	// already by the client.
	ErrInvalidArgument = errors.New("lockd: invalid argument")

	// ErrUnavailable means no endpoint could serve the call: none was
	// reachable, or the cluster had no leader, until the retries ran out.
	ErrUnavailable = wire.ErrUnavailable

	// ErrClusterMismatch means an endpoint answered with a cluster id other
	// than the one this Client saw first. The client stops using it; when no
	// endpoint of the first cluster is left, calls fail with this error.
	ErrClusterMismatch = wire.ErrClusterMismatch

	// ErrSessionClosed means the session was closed with Session.Close (or
	// Client.Close) and can no longer be used.
	ErrSessionClosed = errors.New("lockd: session closed")

	// ErrWaitDropped means the server dropped a queued wait before granting
	// it, for example because it was cancelled from elsewhere.
	ErrWaitDropped = errors.New("lockd: wait dropped")

	// ErrTooMany means a server limit (sessions, locks, queue length) was
	// reached.
	ErrTooMany = errors.New("lockd: server limit reached")

	// ErrClosed means the Client was closed.
	ErrClosed = wire.ErrClosed

	// ErrAlreadyDone means the lock's job was completed (Mutex.Complete) and
	// its completion mark is still kept: there is nothing to do. The error
	// is a *DoneError saying who did it, when, with which token.
	ErrAlreadyDone = errors.New("lockd: already done")

	// ErrNoLeader means an election has no leader now.
	ErrNoLeader = errors.New("lockd: election has no leader")

	// ErrWatchReset means a watch lost events: its position was older than
	// the server keeps, the server restored a snapshot, or the consumer fell
	// too far behind. Re-read the state (ListLocks, Election.Leader); the
	// watch goes on after the reset's position.
	ErrWatchReset = errors.New("lockd: watch reset, events were lost")

	// ErrPermissionDenied means the call was refused: it did not present
	// its session's secret, or the identity of its token may not do this
	// (see docs/security.md). Not retried.
	ErrPermissionDenied = errors.New("lockd: permission denied")

	// ErrUnauthenticated means the server runs with authentication and the
	// call carried no token, or one it does not know (WithToken).
	ErrUnauthenticated = errors.New("lockd: unauthenticated")

	// ErrRateLimited means a per-identity limit was reached: its request
	// rate, its sessions or its waiting acquires. The message says which.
	// It also matches ErrTooMany.
	ErrRateLimited = errors.New("lockd: rate limited")
	// ErrDeadlock means the server refused a wait that would close a cycle
	// of sessions waiting for each other (each holding what the next one
	// waits for); the message names the cycle. Nothing was queued. Release
	// what the session holds, or take every lock in one MultiLock.
	ErrDeadlock = errors.New("lockd: deadlock")
	// ErrUpgradeRequired means the request needs a command version some
	// member of the cluster does not apply yet: the message names the
	// versions and the members behind. Upgrade every node, then retry.
	ErrUpgradeRequired = errors.New("lockd: upgrade required")
)

// Holder describes one current holder of a lock, as reported in a
// *BusyError.
type Holder struct {
	// SessionID is the holding session.
	SessionID string
	// Owner is the holding session's owner label (host/pid by default).
	Owner string
	// Shared is true for a shared (semaphore or read) hold, false for an
	// exclusive one.
	Shared bool
	// Token is the hold's fencing token.
	Token uint64
	// GrantedAt is when the hold was granted (server wall clock, for
	// display only).
	GrantedAt time.Time
	// Value is the holder's metadata (WithValue).
	Value []byte
}

// BusyError is returned by TryLock when the lock is not free. It matches
// ErrBusy with errors.Is; use errors.As to read the holders.
type BusyError struct {
	// Name is the lock's name.
	Name string
	// Holders are the current holders; the server may truncate the list, and
	// it is empty when the lock is free but other requests wait in its queue.
	Holders []Holder

	err error // the server's error
}

// Error implements error.
func (e *BusyError) Error() string {
	switch len(e.Holders) {
	case 0:
		return fmt.Sprintf("lockd: lock %q busy (requests queued)", e.Name)
	case 1:
		h := e.Holders[0]
		return fmt.Sprintf("lockd: lock %q busy: held by session %s (%s) with token %d", e.Name, h.SessionID, h.Owner, h.Token)
	default:
		return fmt.Sprintf("lockd: lock %q busy: %d holders", e.Name, len(e.Holders))
	}
}

// Is reports whether target is ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// Unwrap returns the server's error.
func (e *BusyError) Unwrap() error { return e.err }

// statusError is an error mapped to one of the sentinels. It matches the
// sentinel with errors.Is and wraps the underlying (usually *connect.Error)
// error.
type statusError struct {
	kind error
	err  error
}

func (e *statusError) Error() string {
	msg := e.err.Error()
	var ce *connect.Error
	if errors.As(e.err, &ce) && ce.Message() != "" {
		msg = ce.Message()
	}
	return e.kind.Error() + ": " + msg
}

func (e *statusError) Unwrap() []error { return []error{e.kind, e.err} }

// wrap marks err as kind unless it already is.
func wrap(kind, err error) error {
	if errors.Is(err, kind) {
		return err
	}
	return &statusError{kind: kind, err: err}
}

// mapError turns an error returned by the API into one that matches the
// package's sentinels: by the ErrorDetail's reason first, then by the Connect
// code. name is the lock concerned, if any. Errors that are already mapped,
// and context errors, are returned unchanged.
func mapError(err error, name string) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, ErrClusterMismatch) {
		return err
	}
	if d := wire.ErrorDetail(err); d != nil {
		switch d.GetReason() {
		case lockdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT:
			return wrap(ErrInvalidArgument, err)
		case lockdv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND,
			lockdv1.ErrorReason_ERROR_REASON_SESSION_REVOKED:
			return wrap(ErrLeaseLost, err)
		case lockdv1.ErrorReason_ERROR_REASON_BUSY:
			return &BusyError{Name: name, Holders: holders(d.GetHolders()), err: err}
		case lockdv1.ErrorReason_ERROR_REASON_ALREADY_HELD:
			return wrap(ErrAlreadyHeld, err)
		case lockdv1.ErrorReason_ERROR_REASON_NOT_HELD:
			return wrap(ErrNotHeld, err)
		case lockdv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH:
			return wrap(ErrLimitMismatch, err)
		case lockdv1.ErrorReason_ERROR_REASON_NOT_LEADER,
			lockdv1.ErrorReason_ERROR_REASON_NO_LEADER,
			lockdv1.ErrorReason_ERROR_REASON_OUTCOME_UNKNOWN:
			return wrap(ErrUnavailable, err)
		case lockdv1.ErrorReason_ERROR_REASON_WAIT_DROPPED:
			return wrap(ErrWaitDropped, err)
		case lockdv1.ErrorReason_ERROR_REASON_TOO_MANY:
			return wrap(ErrTooMany, err)
		case lockdv1.ErrorReason_ERROR_REASON_ALREADY_DONE:
			return doneError(name, d.GetMark(), err)
		case lockdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED:
			return wrap(ErrPermissionDenied, err)
		case lockdv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED:
			return wrap(ErrUnauthenticated, err)
		case lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED:
			return wrap(ErrRateLimited, wrap(ErrTooMany, err))
		case lockdv1.ErrorReason_ERROR_REASON_DEADLOCK:
			return wrap(ErrDeadlock, err)
		case lockdv1.ErrorReason_ERROR_REASON_UPGRADE_REQUIRED:
			return wrap(ErrUpgradeRequired, err)
		}
	}
	switch ce.Code() {
	case connect.CodeInvalidArgument:
		return wrap(ErrInvalidArgument, err)
	case connect.CodeNotFound:
		return wrap(ErrLeaseLost, err)
	case connect.CodeAlreadyExists:
		return wrap(ErrAlreadyHeld, err)
	case connect.CodeUnavailable:
		return wrap(ErrUnavailable, err)
	case connect.CodeAborted:
		return wrap(ErrWaitDropped, err)
	case connect.CodeResourceExhausted:
		return wrap(ErrTooMany, err)
	case connect.CodePermissionDenied:
		return wrap(ErrPermissionDenied, err)
	case connect.CodeUnauthenticated:
		return wrap(ErrUnauthenticated, err)
	}
	return err
}

// DoneError is returned (matching ErrAlreadyDone) when a lock's job was
// already completed.
type DoneError struct {
	// Name is the lock.
	Name string
	// SessionID and Owner identify who completed the job.
	SessionID, Owner string
	// Token is the token of the hold that completed it.
	Token uint64
	// CompletedAt is when (server wall clock, for people).
	CompletedAt time.Time
	// Retention is how long the mark is kept from when it was set (a leader
	// change restarts it in full).
	Retention time.Duration
	err       error
}

// Error implements error: who completed the job, when, with which token.
func (e *DoneError) Error() string {
	return fmt.Sprintf("lockd: lock %q already done by %s (token %d) at %s", e.Name, e.Owner, e.Token, e.CompletedAt.UTC().Format(time.RFC3339))
}

// Is reports ErrAlreadyDone.
func (e *DoneError) Is(target error) bool { return target == ErrAlreadyDone }

// Unwrap returns the server's error.
func (e *DoneError) Unwrap() error { return e.err }

func doneError(name string, m *lockdv1.Mark, err error) *DoneError {
	d := &DoneError{Name: name, err: err}
	if m != nil {
		d.SessionID, d.Owner, d.Token = m.GetSessionId(), m.GetOwner(), m.GetToken()
		if m.GetCompletedAt() != nil {
			d.CompletedAt = m.GetCompletedAt().AsTime()
		}
		d.Retention = m.GetRetention().AsDuration()
	}
	return d
}

func holders(hs []*lockdv1.Holder) []Holder {
	if len(hs) == 0 {
		return nil
	}
	out := make([]Holder, 0, len(hs))
	for _, h := range hs {
		var at time.Time
		if h.GetGrantedAt() != nil {
			at = h.GetGrantedAt().AsTime()
		}
		out = append(out, Holder{
			SessionID: h.GetSessionId(),
			Owner:     h.GetOwner(),
			Shared:    h.GetMode() == lockdv1.Mode_MODE_SHARED,
			Token:     h.GetToken(),
			GrantedAt: at,
			Value:     h.GetValue(),
		})
	}
	return out
}
