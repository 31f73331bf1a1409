package redislock

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/lockd-dev/lockd"
)

// Defaults of the options.
const (
	// DefaultTTL is the time a lock key lives on Redis after each acquire or
	// renewal (WithTTL). Renewals go out every TTL/3 while the lock is held.
	DefaultTTL = 10 * time.Second
	// DefaultPrefix starts every key and channel name (WithPrefix).
	DefaultPrefix = "lockd:"
	// DefaultRequestTimeout bounds one request to a single Redis instance
	// (New).
	DefaultRequestTimeout = time.Second
	// DefaultNodeTimeout bounds one request to one Redlock node
	// (NewRedlock): short, so that a dead node costs little of the lock's
	// validity.
	DefaultNodeTimeout = 100 * time.Millisecond

	minTTL = 250 * time.Millisecond
	maxTTL = time.Hour
)

type config struct {
	ttl      time.Duration
	prefix   string
	timeout  time.Duration
	eviction bool
	pubsub   bool
	logger   *slog.Logger
}

func newConfig(timeout time.Duration, opts []Option) (config, error) {
	cfg := config{ttl: DefaultTTL, prefix: DefaultPrefix, timeout: timeout, pubsub: true}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return cfg, err
		}
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// Option configures a Client (New) or a Redlock (NewRedlock).
type Option func(*config) error

// WithTTL sets how long a lock key lives on Redis after each acquire or
// renewal (default 10 s; 250 ms to 1 h). While a lock is held it is renewed
// every TTL/3. The client gives the lock up at sent + TTL·0.99 −
// max(100 ms, 2 % TTL) after the last confirmed acquire or renewal was
// sent, strictly before Redis can expire the key. A longer TTL rides out
// longer Redis stalls; a shorter one frees a crashed holder's lock sooner.
func WithTTL(d time.Duration) Option {
	return func(c *config) error {
		if d < minTTL || d > maxTTL {
			return fmt.Errorf("%w: redislock: ttl %v out of bounds [%v, %v]", lockd.ErrInvalidArgument, d, minTTL, maxTTL)
		}
		c.ttl = d
		return nil
	}
}

// WithPrefix sets the prefix of every key and pub/sub channel (default
// "lockd:"). A lock named n uses the keys prefix{n}, prefix{n}:token and
// prefix{n}:meta (the braces keep them in one Redis Cluster slot). Every
// user of a lock must use the same prefix.
func WithPrefix(p string) Option {
	return func(c *config) error {
		c.prefix = p
		return nil
	}
}

// WithRequestTimeout bounds one request to one Redis server (default 1 s
// for New, 100 ms per node for NewRedlock). A request that times out has
// an unknown outcome: the client deletes its key again (compare-and-delete)
// before it retries.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: redislock: request timeout %v must be positive", lockd.ErrInvalidArgument, d)
		}
		c.timeout = d
		return nil
	}
}

// WithEviction accepts a Redis maxmemory-policy that may evict keys. An
// evicted lock key lets a second holder in before the first one's next
// renewal notices (at most TTL/3 later): mutual exclusion breaks for that
// window. Without this option New and NewRedlock refuse such a server with
// ErrEvictionPolicy.
func WithEviction() Option {
	return func(c *config) error {
		c.eviction = true
		return nil
	}
}

// WithoutPubSub turns off the wake-up of waiters by a pub/sub message at
// release: waiters then retry on their backoff alone (exponential with full
// jitter, capped by the holder's remaining TTL). Redlock never uses
// pub/sub.
func WithoutPubSub() Option {
	return func(c *config) error {
		c.pubsub = false
		return nil
	}
}

// WithLogger sets the logger for events such as lost locks and failed
// renewals. The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: redislock: nil logger", lockd.ErrInvalidArgument)
		}
		c.logger = l
		return nil
	}
}
