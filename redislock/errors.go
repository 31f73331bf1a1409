package redislock

import (
	"errors"
	"fmt"

	"github.com/lockd-dev/lockd"
)

// Errors. Besides these, calls return lockd's sentinels, so that
// application code checks the same errors whatever the backend:
// lockd.ErrBusy (TryLock found the lock taken), lockd.ErrNotHeld,
// lockd.ErrLeaseLost, lockd.ErrAlreadyHeld, lockd.ErrLimitMismatch,
// lockd.ErrInvalidArgument, lockd.ErrUnavailable (Redis unreachable, slow
// or refusing) and lockd.ErrClosed.
var (
	// ErrNoQuorum means a Redlock acquire or extend could not reach a
	// majority of the nodes (down, slow past the per-node timeout, or
	// refusing) within one attempt. It matches lockd.ErrUnavailable too.
	// Lock keeps retrying until its context ends and then returns an error
	// matching both ErrNoQuorum and the context's error.
	ErrNoQuorum = fmt.Errorf("redislock: no quorum: %w", lockd.ErrUnavailable)

	// ErrEvictionPolicy means New or NewRedlock found a Redis node whose
	// maxmemory-policy may evict keys (allkeys-* or volatile-*): an evicted
	// lock key is a lock silently given to the next caller. Configure
	// maxmemory-policy noeviction, or accept the risk with WithEviction.
	ErrEvictionPolicy = errors.New("redislock: redis maxmemory-policy may evict lock keys")
)

// errGone is what a store answers when the key no longer carries our owner
// value: it expired, was evicted, flushed, or taken by another owner.
var errGone = errors.New("redislock: key gone or owned by another")

// unavailable marks err (a Redis or network error) as lockd.ErrUnavailable.
func unavailable(err error) error {
	if errors.Is(err, lockd.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", lockd.ErrUnavailable, err)
}

// busyError is TryLock's answer for a lock that is taken.
func busyError(name string, detail string) error {
	if detail != "" {
		detail = " (" + detail + ")"
	}
	return fmt.Errorf("redislock: lock %q busy%s: %w", name, detail, lockd.ErrBusy)
}
