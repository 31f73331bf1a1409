package main

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd/internal/loadgen"
	"github.com/lockd-dev/lockd/redislock"
)

// redisDriver runs the workloads on one Redis server through the repo's
// redislock package: acquire is SET NX PX (plus the fencing token's INCR,
// in the same Lua script), release a compare-and-delete script that
// publishes a wake-up; a waiter retries with backoff and listens on
// pub/sub.
type redisDriver struct {
	dialCounter
	addr string
}

// System names Redis in the report.
func (d *redisDriver) System() string { return "redis" }

// ErrorKind names err for the report.
func (d *redisDriver) ErrorKind(err error) string { return errorKind(err) }

// NewClient opens a go-redis client with a pool of its own.
func (d *redisDriver) NewClient(ctx context.Context) (loadgen.Client, error) {
	rdb := redis.NewClient(&redis.Options{Addr: d.addr, ContextTimeoutEnabled: true, Dialer: d.dial})
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, err
	}
	return &redisClient{rdb: rdb}, nil
}

type redisClient struct {
	rdb      *redis.Client
	sessions []redisSession
}

// NewSession returns a redislock client whose locks expire after ttl
// unless renewed: Redis has no session, the TTL is per lock.
func (c *redisClient) NewSession(ctx context.Context, ttl time.Duration) (loadgen.Session, error) {
	locks, err := redislock.New(ctx, c.rdb, redislock.WithTTL(ttl))
	if err != nil {
		return nil, err
	}
	s := redisSession{locks}
	c.sessions = append(c.sessions, s)
	return s, nil
}

// Close releases what the sessions hold and closes the pool. A client's
// sessions are opened by one worker, so the list needs no lock.
func (c *redisClient) Close(ctx context.Context) error {
	for _, s := range c.sessions {
		_ = s.Close(ctx)
	}
	return c.rdb.Close()
}

type redisSession struct{ locks *redislock.Client }

// NewMutex returns a redislock mutex.
func (s redisSession) NewMutex(name string) loadgen.Mutex { return s.locks.NewMutex(name) }

// Done is nil: there is no session lease to lose.
func (s redisSession) Done() <-chan struct{} { return nil }

// Close releases what the session holds.
func (s redisSession) Close(ctx context.Context) error { return s.locks.Close(ctx) }
