package lockd

import (
	"context"
	"time"
)

// This file is the lock types a Session hands out: Mutex, Semaphore and
// RWMutex, thin views over the one mechanism in lock.go.

// Mutex is an exclusive lock: while one session holds it, no other session
// holds it in any mode. It is not re-entrant, and one Mutex value holds at
// most one grant at a time. Its methods are safe for concurrent use.
type Mutex struct{ l *lock }

// Lock takes the lock, waiting in the server's FIFO queue until it is
// granted or ctx ends. When ctx ends first, Lock removes its queue entry
// (releasing a grant that raced in) and returns an error matching ctx.Err().
// If the session's lease is lost while waiting, Lock returns at once with
// an error matching ErrLeaseLost, never a grant. While the session lives,
// a cluster that does not answer for a while does not end the wait: it
// goes on, keeping its place in the queue.
func (m *Mutex) Lock(ctx context.Context) error { return m.l.acquire(ctx, false, true) }

// TryLock takes the lock if it is free now, without waiting. A lock that is
// not free gives a *BusyError (matching ErrBusy) naming its holders.
func (m *Mutex) TryLock(ctx context.Context) error { return m.l.acquire(ctx, false, false) }

// Unlock releases the lock. It fails with ErrNotHeld when the lock is not
// held (or the server no longer counts the hold) and with ErrLeaseLost when
// the session's lease is gone. On any other error the hold may still exist
// on the server: the session keeps trying to release it in the background
// until it succeeds or the session ends.
func (m *Mutex) Unlock(ctx context.Context) error { return m.l.release(ctx, false) }

// Complete marks the job this lock guards as done and releases the lock.
// For the retention (1 s to 400 days; a leader change restarts it in full),
// every Lock or TryLock of the name, by any session, fails with an error
// matching ErrAlreadyDone (a *DoneError naming who did it), and so do the
// waiters queued now. This turns "run once across servers" into a
// guarantee: complete only after the work's effects are durable.
func (m *Mutex) Complete(ctx context.Context, retention time.Duration) error {
	return m.l.complete(ctx, retention)
}

// Token returns the fencing token of the current hold, or 0 when not held.
// Pass it to the resource the lock protects, so that it can refuse a holder
// whose token is older than one it has seen.
func (m *Mutex) Token() uint64 { return m.l.token() }

// Context returns a context for the current hold: a child of the session's
// context, cancelled when the lock is unlocked or the lease is lost. Run the
// protected work under it. When not held it is already cancelled.
func (m *Mutex) Context() context.Context { return m.l.context() }

// Done is Context().Done().
func (m *Mutex) Done() <-chan struct{} { return m.l.context().Done() }

// Err returns nil while the lock is held and its lease live; otherwise why
// not: an error matching ErrLeaseLost, ErrSessionClosed or ErrNotHeld.
func (m *Mutex) Err() error { return m.l.err() }

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.l.name }

// ReleaseRequested returns a channel that receives a ReleaseRequest when
// someone asks the current hold to let go (RequestRelease, `lockd
// request-release`): at most one per hold, only for the hold current when
// it arrives (its Token). The channel has a buffer of one and is never
// closed; the Mutex returns the same one for its whole life, across holds,
// and a grant drops an unread request of an earlier hold. A request made
// before the first call, or while the client's stream was broken, is
// delivered once the session is subscribed (pending requests are sent
// again). It costs a subscription of the session on the client's session
// stream, or, with the stream off, a watch of the lock's name. Select on it
// together with Done:
//
//	select {
//	case r := <-m.ReleaseRequested():
//		log.Printf("asked to let go of %s: %s", r.Name, r.Reason)
//		finishSoon()
//	case <-m.Done():
//	}
func (m *Mutex) ReleaseRequested() <-chan ReleaseRequest { return m.l.releaseRequested() }

// Semaphore lets up to a fixed number of holders (permits) hold a lock at
// once, each with its own token. Its methods are safe for concurrent use;
// one Semaphore value holds at most one permit at a time.
type Semaphore struct {
	l       *lock
	permits uint32
}

// Lock takes a permit, waiting in the server's FIFO queue until one is
// granted or ctx ends, with the same cancellation and lease-loss behaviour
// as Mutex.Lock. It fails with ErrLimitMismatch when the lock exists with
// another number of permits.
func (m *Semaphore) Lock(ctx context.Context) error { return m.l.acquire(ctx, true, true) }

// TryLock takes a permit if one is free now, without waiting; otherwise it
// returns a *BusyError (matching ErrBusy).
func (m *Semaphore) TryLock(ctx context.Context) error { return m.l.acquire(ctx, true, false) }

// Unlock gives the permit back, with the same errors as Mutex.Unlock.
func (m *Semaphore) Unlock(ctx context.Context) error { return m.l.release(ctx, true) }

// Token returns the fencing token of the held permit, or 0.
func (m *Semaphore) Token() uint64 { return m.l.token() }

// Context returns a context for the held permit, cancelled at Unlock or
// lease loss (already cancelled when not held).
func (m *Semaphore) Context() context.Context { return m.l.context() }

// Done is Context().Done().
func (m *Semaphore) Done() <-chan struct{} { return m.l.context().Done() }

// Err returns nil while a permit is held and its lease live; otherwise why
// not, as for Mutex.Err.
func (m *Semaphore) Err() error { return m.l.err() }

// Name returns the lock's name.
func (m *Semaphore) Name() string { return m.l.name }

// ReleaseRequested is Mutex.ReleaseRequested for the held permit.
func (m *Semaphore) ReleaseRequested() <-chan ReleaseRequest { return m.l.releaseRequested() }

// Permits returns the number of permits.
func (m *Semaphore) Permits() uint32 { return m.permits }

// RWMutex is a read-write lock: any number of readers (shared holders), or
// one writer (exclusive). A writer waiting in the queue holds back readers
// behind it. One RWMutex value holds at most one grant at a time, read or
// write. Its methods are safe for concurrent use.
type RWMutex struct{ l *lock }

// Lock takes the write lock, waiting until granted or ctx ends, as
// Mutex.Lock.
func (m *RWMutex) Lock(ctx context.Context) error { return m.l.acquire(ctx, false, true) }

// TryLock takes the write lock if it is free now, without waiting.
func (m *RWMutex) TryLock(ctx context.Context) error { return m.l.acquire(ctx, false, false) }

// Unlock releases the write lock; ErrNotHeld if it is not held (or only
// the read lock is).
func (m *RWMutex) Unlock(ctx context.Context) error { return m.l.release(ctx, false) }

// RLock takes the read lock, waiting until granted or ctx ends, as
// Mutex.Lock.
func (m *RWMutex) RLock(ctx context.Context) error { return m.l.acquire(ctx, true, true) }

// TryRLock takes the read lock if it can be granted now, without waiting.
func (m *RWMutex) TryRLock(ctx context.Context) error { return m.l.acquire(ctx, true, false) }

// RUnlock releases the read lock; ErrNotHeld if it is not held (or only
// the write lock is).
func (m *RWMutex) RUnlock(ctx context.Context) error { return m.l.release(ctx, true) }

// Token returns the fencing token of the current hold (read or write), or 0.
func (m *RWMutex) Token() uint64 { return m.l.token() }

// Context returns a context for the current hold (read or write), cancelled
// at unlock or lease loss (already cancelled when not held).
func (m *RWMutex) Context() context.Context { return m.l.context() }

// Done is Context().Done().
func (m *RWMutex) Done() <-chan struct{} { return m.l.context().Done() }

// Err returns nil while held and the lease is live; otherwise why not, as
// for Mutex.Err.
func (m *RWMutex) Err() error { return m.l.err() }

// Name returns the lock's name.
func (m *RWMutex) Name() string { return m.l.name }

// ReleaseRequested is Mutex.ReleaseRequested for the current hold (read
// or write).
func (m *RWMutex) ReleaseRequested() <-chan ReleaseRequest { return m.l.releaseRequested() }
