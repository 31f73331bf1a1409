package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/redislock"
)

// runBackendsHelp is the part of lockd run's help on --backend: what each
// backend can and cannot promise (docs/backends.md).
const runBackendsHelp = `
Backends (--backend):

	(none)     lockd at --endpoints: FIFO queue, fencing tokens strictly
	           increasing for the cluster's life, --shared, --once,
	           --lock-delay. Survives a minority of nodes down.
	redis://HOST:PORT
	           one Redis (or Valkey) server. LOCKD_TOKEN is a per-lock
	           counter. Mutual exclusion holds only while Redis keeps its
	           data: a restart without persistence (AOF appendfsync
	           always), FLUSHALL, eviction (refused unless noeviction), or
	           a failover to an asynchronous replica can hand the lock to
	           another while CMD runs; the loss is noticed at the next
	           renewal (TTL/3), too late to prevent the overlap. No queue
	           (waiters poll), no --shared, --once or --lock-delay.
	redis://A,redis://B,redis://C (or --backend repeated)
	           Redlock over an odd number (3 or more) of independent Redis
	           nodes: survives a minority down, but issues NO fencing token
	           (LOCKD_TOKEN is not set) and assumes bounded clock drift and
	           no process pause past the validity; also no --limit.
`

// addBackend adds the Redis URLs of one --backend value (a comma list).
func (f *runFlags) addBackend(v string) error {
	for _, u := range strings.Split(v, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		if !strings.HasPrefix(u, "redis://") && !strings.HasPrefix(u, "rediss://") {
			return fmt.Errorf("want redis://HOST:PORT or rediss://HOST:PORT URLs, got %q", u)
		}
		if _, err := redis.ParseURL(u); err != nil {
			return fmt.Errorf("%q: %w", u, err)
		}
		f.redis = append(f.redis, u)
	}
	return nil
}

// checkRedis refuses the flags the Redis backends cannot honour.
func (f *runFlags) checkRedis() error {
	switch {
	case len(f.redis) == 0:
		return nil
	case f.shared:
		return errors.New("--shared needs the lockd backend: Redis has no read-write locks")
	case f.once > 0:
		return errors.New("--once needs the lockd backend: Redis keeps no completion marks")
	case f.lockDelay > 0:
		return errors.New("--lock-delay needs the lockd backend")
	case len(f.redis) > 1 && f.limitSet:
		return errors.New("--limit needs the lockd backend or a single Redis: Redlock has no semaphores")
	case len(f.redis) > 1 && len(f.redis)%2 == 0:
		return fmt.Errorf("--backend: Redlock needs an odd number of Redis nodes, 3 or more (got %d)", len(f.redis))
	}
	return nil
}

// acquireRedis takes the lock on Redis (one URL) or Redlock (several). The
// returned func closes the backend and its connections.
func (c *RunCommand) acquireRedis(ctx context.Context, f *runFlags) (lease, func(), error) {
	var clients []redis.UniversalClient
	closeAll := func() {
		for _, rc := range clients {
			_ = rc.Close()
		}
	}
	for _, u := range f.redis {
		opt, err := redis.ParseURL(u)
		if err != nil {
			closeAll()
			return nil, nil, usageError{fmt.Errorf("--backend %q: %w", u, err)}
		}
		opt.ContextTimeoutEnabled = true
		clients = append(clients, redis.NewClient(opt))
	}
	// Connecting is bounded by --connect-timeout, like lockd's endpoints.
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if f.client.connectTimeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, f.client.connectTimeout)
	}
	defer cancel()
	opts := []redislock.Option{redislock.WithTTL(f.ttl)}
	var b lockd.Backend
	var closeBackend func(context.Context) error
	if len(clients) == 1 {
		rl, err := redislock.New(cctx, clients[0], opts...)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		b, closeBackend = rl.Backend(), rl.Close
	} else {
		rl, err := redislock.NewRedlock(cctx, clients, opts...)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		b, closeBackend = rl.Backend(), rl.Close
	}
	done := func() {
		_ = closeBackend(context.Background())
		closeAll()
	}
	var l lockd.Locker
	if f.limitSet {
		l = b.NewSemaphore(f.name, uint32(f.limit))
	} else {
		l = b.NewMutex(f.name)
	}
	rl, ok := l.(redisLocker)
	if !ok {
		done()
		return nil, nil, fmt.Errorf("backend: %w: no lease deadline on this lock", errors.ErrUnsupported)
	}
	var err error
	if f.waitSet && f.wait == 0 {
		err = l.TryLock(ctx)
	} else {
		err = l.Lock(ctx)
	}
	if err != nil {
		return nil, done, err
	}
	return newRedisLease(rl, f.ttl), done, nil
}
