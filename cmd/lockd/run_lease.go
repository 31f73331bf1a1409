package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd-dev/lockd"
)

// lease is a granted lock as lockd run's supervision sees it, whatever the
// backend: a lockd session and its lock, or a self-renewing Redis lock.
type lease interface {
	// token is the fencing token; 0 when the backend issues none (Redlock).
	token() uint64
	// sessionID names the lockd session; "" on Redis.
	sessionID() string
	// ttl is the lease's TTL as granted, for the default kill grace.
	ttl() time.Duration
	// deadline is when the client stops counting on the hold, renewed by
	// the backend's keepalives.
	deadline() time.Time
	// changed is signalled when deadline may have moved.
	changed() <-chan struct{}
	// lost is closed when the hold is lost (or released); lostReason says
	// why, for the supervisor's stop message.
	lost() <-chan struct{}
	lostReason() string
	// err is nil while the hold is live.
	err() error
	// complete marks the job done for d and releases the lock (--once).
	complete(ctx context.Context, d time.Duration) error
	// release gives the hold up (ending a lockd session), trying for at
	// most timeout, at least once.
	release(timeout time.Duration) error
}

// lockdLease is a lock held by a lockd session of its own.
type lockdLease struct {
	sess *lockd.Session
	lock heldLock
	dl   *deadlineRelay
}

func (l *lockdLease) token() uint64            { return l.lock.Token() }
func (l *lockdLease) sessionID() string        { return l.sess.ID() }
func (l *lockdLease) ttl() time.Duration       { return l.sess.TTL() }
func (l *lockdLease) changed() <-chan struct{} { return l.dl.changed }
func (l *lockdLease) err() error               { return l.sess.Err() }

// lost: the lock's context is a child of the session's, so it ends with
// the lease too.
func (l *lockdLease) lost() <-chan struct{} { return l.lock.Done() }

func (l *lockdLease) lostReason() string {
	if l.sess.Err() != nil {
		return "lease lost"
	}
	if d := l.lock.Deadline(); !d.IsZero() && !time.Now().Before(d) && d.Before(l.sess.Deadline()) {
		return "hold budget (--max-hold) ran out"
	}
	return "lock lost"
}

// deadline is the lease's, or the hold budget's when that ends first.
func (l *lockdLease) deadline() time.Time {
	d := l.dl.get()
	if d.IsZero() {
		d = l.sess.Deadline()
	}
	if hd := l.lock.Deadline(); !hd.IsZero() && hd.Before(d) {
		return hd
	}
	return d
}

func (l *lockdLease) complete(ctx context.Context, d time.Duration) error {
	m, ok := l.lock.(*lockd.Mutex)
	if !ok {
		return fmt.Errorf("complete: %w: only an exclusive lock can be completed", errors.ErrUnsupported)
	}
	return m.Complete(ctx, d)
}

func (l *lockdLease) release(timeout time.Duration) error { return closeSession(l.sess, timeout) }

// redisLocker is a redislock Mutex or Semaphore.
type redisLocker interface {
	lockd.Locker
	Deadline() time.Time
}

// redisLease is a lock held on Redis or Redlock; its handle renews itself.
// The Redis handles have no deadline callback: the deadline is read every
// TTL/10, well inside the TTL/3 renewal period.
type redisLease struct {
	l       redisLocker
	t       time.Duration
	tick    *time.Ticker
	changes chan struct{}
}

func newRedisLease(l redisLocker, ttl time.Duration) *redisLease {
	r := &redisLease{l: l, t: ttl, tick: time.NewTicker(max(ttl/10, time.Millisecond)), changes: make(chan struct{}, 1)}
	go func() {
		for {
			select {
			case <-r.tick.C:
				select {
				case r.changes <- struct{}{}:
				default:
				}
			case <-l.Done(): // lost or released
				return
			}
		}
	}()
	return r
}

func (r *redisLease) token() uint64            { return r.l.Token() }
func (r *redisLease) sessionID() string        { return "" }
func (r *redisLease) ttl() time.Duration       { return r.t }
func (r *redisLease) deadline() time.Time      { return r.l.Deadline() }
func (r *redisLease) changed() <-chan struct{} { return r.changes }
func (r *redisLease) lost() <-chan struct{}    { return r.l.Done() }
func (r *redisLease) lostReason() string       { return "lock lost" }
func (r *redisLease) err() error               { return r.l.Err() }

func (r *redisLease) complete(context.Context, time.Duration) error {
	return fmt.Errorf("complete: %w: the Redis backends keep no completion marks", errors.ErrUnsupported)
}

func (r *redisLease) release(timeout time.Duration) error {
	r.tick.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, 0))
	defer cancel()
	return r.l.Unlock(ctx)
}
