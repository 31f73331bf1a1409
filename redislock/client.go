package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd"
)

// Client makes locks on a single Redis instance (or any server speaking
// the Redis protocol: Valkey, KeyDB, Dragonfly). It is safe for concurrent
// use. It does not own the go-redis client it was given: Close releases
// the locks it holds but leaves that client open.
//
// A single instance is a single point of failure, and its replication (if
// any) is asynchronous: a failover to a replica can lose a lock. See the
// package documentation for what it promises.
type Client struct {
	rdb redis.UniversalClient
	b   *backend
}

// New returns a Client for rdb. It checks the server's maxmemory-policy
// (where CONFIG GET is allowed) and fails with ErrEvictionPolicy for a
// policy that may evict keys, unless WithEviction accepts that. It fails
// with an error matching lockd.ErrUnavailable when the server cannot be
// reached within ctx, and with lockd.ErrInvalidArgument for bad options.
//
// Create rdb with ContextTimeoutEnabled so that contexts also bound the
// socket reads; otherwise a hung server keeps a call for go-redis's
// ReadTimeout. Lease loss does not depend on it: the lock's Context is
// cancelled by a client-side timer.
func New(ctx context.Context, rdb redis.UniversalClient, opts ...Option) (*Client, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: redislock: nil redis client", lockd.ErrInvalidArgument)
	}
	cfg, err := newConfig(DefaultRequestTimeout, opts)
	if err != nil {
		return nil, err
	}
	if err := checkServer(ctx, rdb, cfg); err != nil {
		return nil, err
	}
	c := &Client{rdb: rdb, b: newBackend(cfg)}
	if cfg.pubsub {
		c.b.wake = newWaker(rdb, cfg)
	}
	return c, nil
}

// checkServer pings the server and refuses an evicting maxmemory-policy.
func checkServer(ctx context.Context, rdb redis.UniversalClient, cfg config) error {
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redislock: ping: %w", unavailable(err))
	}
	res, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		var rerr redis.Error
		if errors.As(err, &rerr) {
			// CONFIG is renamed, disabled or not permitted: cannot check.
			cfg.logger.Info("maxmemory-policy not checked", "err", err)
			return nil
		}
		return fmt.Errorf("redislock: config get maxmemory-policy: %w", unavailable(err))
	}
	p := res["maxmemory-policy"]
	if p == "" || p == "noeviction" || cfg.eviction {
		return nil
	}
	return fmt.Errorf("%w: maxmemory-policy is %s (set noeviction, or pass WithEviction to accept losing locks to eviction)", ErrEvictionPolicy, p)
}

// NewMutex returns an exclusive lock on name. The handle does not touch
// Redis until Lock or TryLock; a bad name makes them fail with
// lockd.ErrInvalidArgument.
func (c *Client) NewMutex(name string) *Mutex {
	key, tok, _, ch := c.b.keys(name)
	return &Mutex{l: newLock(c.b, name, &mutexStore{rdb: c.rdb, cfg: &c.b.cfg, keys: []string{key, tok}, ch: ch, tokens: true})}
}

// NewSemaphore returns a lock on name that up to permits holders share.
// Every user of the name must agree on permits (otherwise Lock fails with
// lockd.ErrLimitMismatch); permits must be positive.
func (c *Client) NewSemaphore(name string, permits uint32) *Semaphore {
	key, tok, meta, ch := c.b.keys(name)
	l := newLock(c.b, name, &semStore{rdb: c.rdb, cfg: &c.b.cfg, keys: []string{key, tok, meta}, ch: ch, permits: permits})
	if permits == 0 && l.err == nil {
		l.err = fmt.Errorf("%w: redislock: semaphore %q needs at least one permit", lockd.ErrInvalidArgument, name)
	}
	return &Semaphore{l: l, permits: permits}
}

// Backend returns the Client as a lockd.Backend.
func (c *Client) Backend() lockd.Backend { return clientBackend{c} }

// Close releases every lock the Client holds (best effort, within ctx) and
// stops its pub/sub subscription. Later acquires fail with lockd.ErrClosed.
func (c *Client) Close(ctx context.Context) error { return c.b.close(ctx) }

type clientBackend struct{ c *Client }

func (b clientBackend) NewMutex(name string) lockd.Locker { return b.c.NewMutex(name) }

func (b clientBackend) NewSemaphore(name string, permits uint32) lockd.Locker {
	return b.c.NewSemaphore(name, permits)
}

// ttlArg is the TTL in milliseconds, as the scripts take it.
func ttlArg(cfg *config) string { return strconv.FormatInt(cfg.ttl.Milliseconds(), 10) }

// pair decodes a script's {code, value} answer.
func pair(v any, err error) (int64, int64, error) {
	if err != nil {
		return 0, 0, err
	}
	s, ok := v.([]any)
	if !ok || len(s) != 2 {
		return 0, 0, fmt.Errorf("redislock: unexpected script answer %v", v)
	}
	a, ok1 := s[0].(int64)
	b, ok2 := s[1].(int64)
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("redislock: unexpected script answer %v", v)
	}
	return a, b, nil
}

// mutexStore is a mutex on one server.
type mutexStore struct {
	rdb    redis.UniversalClient
	cfg    *config
	keys   []string // lock, token counter
	ch     string
	tokens bool
}

func (s *mutexStore) channel() string { return s.ch }

func (s *mutexStore) acquire(ctx context.Context, owner string) (bool, uint64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	want := "0"
	if s.tokens {
		want = "1"
	}
	code, v, err := pair(mutexAcquire.Run(ctx, s.rdb, s.keys, owner, ttlArg(s.cfg), want).Result())
	switch {
	case err != nil:
		return false, 0, 0, unavailable(err)
	case code == 1:
		return true, uint64(v), 0, nil
	case code == -1:
		return false, 0, 0, fmt.Errorf("%w: the name is held as a semaphore", lockd.ErrLimitMismatch)
	default:
		return false, 0, time.Duration(max(v, 0)) * time.Millisecond, nil
	}
}

func (s *mutexStore) extend(ctx context.Context, owner string) error {
	return oneOrGone(mutexExtend.Run(ctx, s.rdb, s.keys[:1], owner, ttlArg(s.cfg)).Int64())
}

func (s *mutexStore) release(ctx context.Context, owner string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	return oneOrGone(mutexRelease.Run(ctx, s.rdb, s.keys[:1], owner, s.ch).Int64())
}

// oneOrGone maps a script's 1/0 answer to nil/errGone.
func oneOrGone(n int64, err error) error {
	switch {
	case err != nil:
		return unavailable(err)
	case n == 1:
		return nil
	default:
		return errGone
	}
}

// semStore is a semaphore on one server.
type semStore struct {
	rdb     redis.UniversalClient
	cfg     *config
	keys    []string // lock, token counter, meta
	ch      string
	permits uint32
}

func (s *semStore) channel() string { return s.ch }

func (s *semStore) acquire(ctx context.Context, owner string) (bool, uint64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	code, v, err := pair(semAcquire.Run(ctx, s.rdb, s.keys, owner, ttlArg(s.cfg), strconv.FormatUint(uint64(s.permits), 10)).Result())
	switch {
	case err != nil:
		return false, 0, 0, unavailable(err)
	case code == 1:
		return true, uint64(v), 0, nil
	case code == -1 && v == 0:
		return false, 0, 0, fmt.Errorf("%w: the name is held as a mutex", lockd.ErrLimitMismatch)
	case code == -1:
		return false, 0, 0, fmt.Errorf("%w: the semaphore has %d permits, not %d", lockd.ErrLimitMismatch, v, s.permits)
	default:
		return false, 0, time.Duration(max(v, 0)) * time.Millisecond, nil
	}
}

func (s *semStore) extend(ctx context.Context, owner string) error {
	return oneOrGone(semExtend.Run(ctx, s.rdb, s.keys, owner, ttlArg(s.cfg)).Int64())
}

func (s *semStore) release(ctx context.Context, owner string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	return oneOrGone(semRelease.Run(ctx, s.rdb, s.keys, owner, s.ch).Int64())
}
