package lockd

import "context"

// Locker is a lock handle as every backend provides it: the lockd Mutex and
// Semaphore, and the Mutex and Semaphore of the Redis backends
// (package redislock). Code written against Locker and Backend switches
// backend by changing one constructor.
//
// The contract, whatever the backend: a handle holds at most one grant at a
// time and is not re-entrant (a second Lock while held fails with
// ErrAlreadyHeld). Lock waits until granted or ctx ends; TryLock never
// waits and fails with an error matching ErrBusy. Unlock fails with
// ErrNotHeld when nothing is held and with ErrLeaseLost when the hold was
// lost before it. While held, Context is live; it is cancelled at Unlock
// (cause ErrNotHeld) or as soon as the client can no longer be sure it
// holds the lock (cause matching ErrLeaseLost), strictly before the backend
// may give the lock to someone else. Token is the grant's fencing token, or
// 0 when not held or when the backend issues none (see the backend's
// documentation: Redlock issues none).
type Locker interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) error
	Unlock(ctx context.Context) error
	Token() uint64
	Context() context.Context
	Done() <-chan struct{}
	Err() error
	Name() string
}

// RWLocker is a read-write lock handle: Locker for the write lock, plus
// the read lock.
type RWLocker interface {
	Locker
	RLock(ctx context.Context) error
	TryRLock(ctx context.Context) error
	RUnlock(ctx context.Context) error
}

// Backend makes lock handles on one lock service. Session.Backend returns
// lockd's; redislock.Client.Backend and redislock.Redlock.Backend return the
// Redis ones. What each backend can and cannot promise is compared in
// docs/backends.md.
type Backend interface {
	// NewMutex returns an exclusive lock on name.
	NewMutex(name string) Locker
	// NewSemaphore returns a lock on name that up to permits holders share.
	// Every user of the name must agree on permits (ErrLimitMismatch).
	NewSemaphore(name string, permits uint32) Locker
}

// RWBackend is a Backend that also makes read-write locks. lockd's backend
// is one; check for it with a type assertion.
type RWBackend interface {
	Backend
	// NewRWMutex returns a read-write lock on name.
	NewRWMutex(name string) RWLocker
}

var (
	_ Locker    = (*Mutex)(nil)
	_ Locker    = (*Semaphore)(nil)
	_ RWLocker  = (*RWMutex)(nil)
	_ RWBackend = sessionBackend{}
)

// Backend returns the session as a Backend (an RWBackend): its locks are
// the session's Mutex, Semaphore and RWMutex, and live as long as the
// session.
func (s *Session) Backend() Backend { return sessionBackend{s} }

type sessionBackend struct{ s *Session }

func (b sessionBackend) NewMutex(name string) Locker { return b.s.NewMutex(name) }

func (b sessionBackend) NewSemaphore(name string, permits uint32) Locker {
	return b.s.NewSemaphore(name, permits)
}

func (b sessionBackend) NewRWMutex(name string) RWLocker { return b.s.NewRWMutex(name) }
