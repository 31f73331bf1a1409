package redislock

import (
	"context"
	"time"
)

// Mutex is an exclusive lock on Redis: while one handle holds it, no other
// handle holds it (within the limits in the package documentation). It is
// not re-entrant; one Mutex value holds at most one grant at a time. Its
// methods are safe for concurrent use.
type Mutex struct{ l *lock }

// Lock takes the lock, retrying until it is granted or ctx ends. Between
// tries it waits with exponential backoff and full jitter, at most until
// the holder's key would expire, and (single instance) wakes early when a
// release is published. When ctx ends first, the error matches ctx.Err()
// and the last try's error (lockd.ErrBusy, lockd.ErrUnavailable or, for
// Redlock, ErrNoQuorum). Waiters are not served in any order: there is no
// queue.
func (m *Mutex) Lock(ctx context.Context) error { return m.l.acquire(ctx, true) }

// TryLock takes the lock if it is free now. A taken lock gives an error
// matching lockd.ErrBusy; an unreachable Redis one matching
// lockd.ErrUnavailable (for Redlock, ErrNoQuorum).
func (m *Mutex) TryLock(ctx context.Context) error { return m.l.acquire(ctx, false) }

// Unlock releases the lock with a compare-and-delete: it never deletes a
// key another owner holds. It cancels Context first. It fails with
// lockd.ErrNotHeld when not held, and with lockd.ErrLeaseLost when the hold
// was lost (Context already ended that way, or the key was found gone or
// another's). If Redis cannot be reached the key expires by its TTL.
func (m *Mutex) Unlock(ctx context.Context) error { return m.l.release(ctx) }

// Token returns the fencing token of the current hold, or 0 when not held.
// On a single instance tokens are strictly increasing per lock name (see
// the package documentation for the limits). Redlock issues no token: it
// always returns 0.
func (m *Mutex) Token() uint64 { return m.l.token() }

// Context returns a context for the current hold, cancelled at Unlock
// (cause lockd.ErrNotHeld) or when the hold is lost (cause matching
// lockd.ErrLeaseLost): at the client deadline without a confirmed renewal,
// or at once when a renewal finds the key gone. When not held it is already
// cancelled.
func (m *Mutex) Context() context.Context { return m.l.context() }

// Done is Context().Done().
func (m *Mutex) Done() <-chan struct{} { return m.l.context().Done() }

// Err returns nil while held; otherwise why not (lockd.ErrLeaseLost or
// lockd.ErrNotHeld).
func (m *Mutex) Err() error { return m.l.errNow() }

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.l.name }

// Deadline returns the client-side end of the current hold (with a
// monotonic clock reading), moved later by each confirmed renewal; the zero
// Time when not held. Context is cancelled at this time unless a renewal is
// confirmed first.
func (m *Mutex) Deadline() time.Time { return m.l.deadline() }

// Semaphore lets up to a fixed number of holders (permits) hold a lock at
// once, each with its own fencing token. Holders live in a sorted set
// scored by their expiry on the Redis server's clock. One Semaphore value
// holds at most one permit at a time; its methods are safe for concurrent
// use.
type Semaphore struct {
	l       *lock
	permits uint32
}

// Lock takes a permit, retrying until one is granted or ctx ends, as
// Mutex.Lock. It fails with lockd.ErrLimitMismatch when the name is held
// with another number of permits (or as a Mutex).
func (s *Semaphore) Lock(ctx context.Context) error { return s.l.acquire(ctx, true) }

// TryLock takes a permit if one is free now; otherwise the error matches
// lockd.ErrBusy.
func (s *Semaphore) TryLock(ctx context.Context) error { return s.l.acquire(ctx, false) }

// Unlock gives the permit back, with the same errors as Mutex.Unlock.
func (s *Semaphore) Unlock(ctx context.Context) error { return s.l.release(ctx) }

// Token returns the fencing token of the held permit, or 0.
func (s *Semaphore) Token() uint64 { return s.l.token() }

// Context returns a context for the held permit, as Mutex.Context.
func (s *Semaphore) Context() context.Context { return s.l.context() }

// Done is Context().Done().
func (s *Semaphore) Done() <-chan struct{} { return s.l.context().Done() }

// Err returns nil while a permit is held; otherwise why not.
func (s *Semaphore) Err() error { return s.l.errNow() }

// Name returns the lock's name.
func (s *Semaphore) Name() string { return s.l.name }

// Permits returns the number of permits.
func (s *Semaphore) Permits() uint32 { return s.permits }

// Deadline returns the client-side end of the held permit, as
// Mutex.Deadline.
func (s *Semaphore) Deadline() time.Time { return s.l.deadline() }
