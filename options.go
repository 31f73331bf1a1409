package lockd

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/lockd-dev/lockd/internal/certs"
	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/label"
	"github.com/lockd-dev/lockd/internal/wire"
)

// DefaultEndpoint is the endpoint a Client uses when none is given: a
// `lockd serve` with no flags on the same machine.
const DefaultEndpoint = "http://127.0.0.1:7070"

// Defaults of the client and session options.
const (
	// DefaultRequestTimeout bounds one attempt of one call (WithRequestTimeout).
	DefaultRequestTimeout = 5 * time.Second
	// DefaultRetryTimeout bounds the retries of a call whose context has no
	// deadline (WithRetryTimeout).
	DefaultRetryTimeout = 30 * time.Second
	// DefaultTTL is a session's lease TTL (WithTTL).
	DefaultTTL = 10 * time.Second
	// minTTL leaves a lease that lasts at all after the client's safety
	// margin; the server sets the real lower bound (1 s by default).
	minTTL        = 250 * time.Millisecond
	maxTTL        = time.Hour
	maxOwnerBytes = 256
	maxValueBytes = 1024      // a hold's value (WithValue)
	maxLockDelay  = time.Hour // the server's bound (WithLockDelay)
)

type config struct {
	endpoints      []string
	rawEndpoints   []string // as given, for the scheme TLS implies
	httpClient     *http.Client
	tlsConfig      *tls.Config  // WithTLSConfig
	tlsFiles       *certs.Store // WithTLSFiles
	requestTimeout time.Duration
	retryTimeout   time.Duration
	connectTimeout time.Duration // 0: none
	logger         *slog.Logger
	stream         bool          // session stream (WithStream)
	dial           wire.DialFunc // WithDialer; nil: a net.Dialer's
	token          string        // bearer token (WithToken); never logged
}

// Option configures a Client in New.
type Option func(*config) error

// WithEndpoints sets the servers the Client talks to, as "host:port",
// "host" (port 7070) or an http:// or https:// URL. Any node of a cluster
// will do: followers forward to the leader, and the client moves to another
// endpoint when one is unreachable or names a leader. The default is
// DefaultEndpoint.
func WithEndpoints(urls ...string) Option {
	return func(c *config) error {
		if len(urls) == 0 {
			return fmt.Errorf("%w: no endpoints", ErrInvalidArgument)
		}
		c.endpoints = c.endpoints[:0]
		for _, u := range urls {
			n, err := normalizeEndpoint(u)
			if err != nil {
				return err
			}
			c.endpoints = appendNew(c.endpoints, n)
		}
		c.rawEndpoints = append([]string(nil), urls...)
		return nil
	}
}

// WithHTTPClient sets the HTTP client used for every call. Its Timeout
// should be zero: Lock blocks in long polls, and every call already has its
// own timeout (WithRequestTimeout). By default the Client uses its own
// transports (h2c or HTTP/2 over TLS for the session stream and the calls
// to endpoints where it is open, HTTP/1.1 for the others) and closes their
// idle connections in Close. A client given here is used for every call;
// the session stream needs it to speak HTTP/2 (for http:// endpoints,
// unencrypted HTTP/2 only in its http.Protocols), else the Client falls
// back to unary calls.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *config) error {
		if hc == nil {
			return fmt.Errorf("%w: nil http client", ErrInvalidArgument)
		}
		c.httpClient = hc
		return nil
	}
}

// WithDialer sets how the Client's own transports open their TCP
// connections (beneath TLS): through a proxy of your own, from a given
// source address, or counting them. By default a net.Dialer's
// DialContext. With WithHTTPClient (whose transport dials) New refuses
// it.
func WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(c *config) error {
		if dial == nil {
			return fmt.Errorf("%w: nil dialer", ErrInvalidArgument)
		}
		c.dial = dial
		return nil
	}
}

// WithStream turns the session stream on or off. On (the default), the
// Client carries every session-scoped call (create, keepalive, acquire,
// release, cancel, complete, close) as frames of one long-lived HTTP/2
// stream per endpoint, and the keepalives of all its sessions as one batch
// per round; an endpoint where no stream can be opened (a proxy that does
// not pass HTTP/2 cleartext) is called unary over HTTP/1.1 instead. Off,
// every call is a unary HTTP/1.1 request: the escape hatch when a proxy
// breaks streams in a way the fallback does not detect. The package reads
// no environment; the lockd command turns the stream off with
// LOCKD_STREAM=off.
func WithStream(on bool) Option {
	return func(c *config) error {
		c.stream = on
		return nil
	}
}

// WithRequestTimeout sets how long one attempt of one call may take before
// it is abandoned and retried (default 5 s). An attempt gets less when the
// call's context deadline is near (half of what is left, while another
// endpoint may be tried) or, for a session's calls, when its lease deadline
// is nearer. A queued Lock's long poll gets its poll time on top.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout %v must be positive", ErrInvalidArgument, d)
		}
		c.requestTimeout = d
		return nil
	}
}

// WithRetryTimeout sets how long a call keeps retrying failed attempts
// (unreachable endpoints, no leader) when its context has no deadline
// (default 30 s). Zero means retry until the context ends. A context with a
// deadline always bounds the retries by itself.
func WithRetryTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: retry timeout %v must not be negative", ErrInvalidArgument, d)
		}
		c.retryTimeout = d
		return nil
	}
}

// WithConnectTimeout sets how long a call keeps retrying while no endpoint
// has answered it at all (every attempt refused, unreachable or timed out),
// whatever its context allows: after d it fails with ErrUnavailable, so that
// a dead cluster gives a fast answer. Once any server answered (even "no
// leader"), the context and the retry timeout decide alone. Each attempt is
// also cut to what is left of d. The default, 0, sets no such limit: a call
// whose context has no deadline then retries for the retry timeout
// (WithRetryTimeout, 30 s by default). The lockd CLI sets 5 s
// (--connect-timeout). With a connect timeout set, a Client that no server
// has answered yet gives up after about a second when every endpoint
// refuses the connection (nothing listens there): the error names them and
// wraps the refusals (errors.Is(err, syscall.ECONNREFUSED)). An endpoint
// that accepts connections but does not speak HTTP (a node's Raft port) is
// named as such at once, with or without a connect timeout.
func WithConnectTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: connect timeout %v must not be negative", ErrInvalidArgument, d)
		}
		c.connectTimeout = d
		return nil
	}
}

// WithLogger sets the logger for events such as lease loss and retries. The
// default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidArgument)
		}
		c.logger = l
		return nil
	}
}

// normalizeEndpoint turns "host:port", "host" or a URL into a base URL
// without a trailing slash; a bad one gives an error matching
// ErrInvalidArgument.
func normalizeEndpoint(s string) (string, error) { return normalizeEndpointScheme(s, "http") }

// normalizeEndpointScheme is normalizeEndpoint with the scheme of an
// endpoint written without one.
func normalizeEndpointScheme(s, scheme string) (string, error) {
	u, err := endpoint.NormalizeScheme(s, scheme)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return u, nil
}

// appendNew appends u to list unless it is there already.
func appendNew(list []string, u string) []string {
	for _, e := range list {
		if e == u {
			return list
		}
	}
	return append(list, u)
}

type sessionConfig struct {
	ttl        time.Duration
	owner      string
	deadlineFn func(time.Time)
}

// SessionOption configures a Session in Client.NewSession.
type SessionOption func(*sessionConfig) error

// WithTTL sets the session's lease TTL (default 10 s). A server accepts 1 s
// to 1 h unless configured otherwise; the client refuses TTLs above 1 h or
// below 250 ms (which its safety margin would use up). A longer TTL survives
// longer pauses and outages; a shorter one hands a crashed holder's locks to
// others sooner. Session.TTL reports the TTL the server granted.
func WithTTL(d time.Duration) SessionOption {
	return func(c *sessionConfig) error {
		if d < minTTL || d > maxTTL {
			return fmt.Errorf("%w: ttl %v out of bounds [%v, %v]", ErrInvalidArgument, d, minTTL, maxTTL)
		}
		c.ttl = d
		return nil
	}
}

// WithOwner sets the session's owner label, shown to people in describe and
// session listings (at most 256 bytes of UTF-8 without control characters,
// as the server requires; default host/pid).
func WithOwner(owner string) SessionOption {
	return func(c *sessionConfig) error {
		if len(owner) > maxOwnerBytes {
			return fmt.Errorf("%w: owner is %d bytes, more than %d", ErrInvalidArgument, len(owner), maxOwnerBytes)
		}
		if err := label.Check("owner", owner); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
		c.owner = owner
		return nil
	}
}

// WithDeadlineFunc registers f to be called with the session's client-side
// lease deadline: once when the session is created and again after every
// confirmed KeepAlive that moves it. Calls are sequential and their
// deadlines never go backwards. f runs on the keepalive goroutine and must
// not block; `lockd run` uses it to renew its process supervisor.
func WithDeadlineFunc(f func(deadline time.Time)) SessionOption {
	return func(c *sessionConfig) error {
		if f == nil {
			return fmt.Errorf("%w: nil deadline func", ErrInvalidArgument)
		}
		c.deadlineFn = f
		return nil
	}
}

type lockConfig struct {
	value     []byte
	lockDelay time.Duration
	maxHold   time.Duration // WithMaxHold (budget.go)
}

// LockOption configures a Mutex, Semaphore or RWMutex. Like the other
// option types it validates its value; as the constructors (NewMutex, …)
// return no error, a bad value is reported by every Lock and TryLock of the
// handle, as an error matching ErrInvalidArgument, before anything is sent.
type LockOption func(*lockConfig) error

// WithValue attaches small metadata (at most 1 KiB) to every hold the lock
// takes, shown to others in describe output and in a *BusyError: who holds
// the lock and why, for people.
func WithValue(v []byte) LockOption {
	return func(c *lockConfig) error {
		if len(v) > maxValueBytes {
			return fmt.Errorf("%w: value is %d bytes, more than %d", ErrInvalidArgument, len(v), maxValueBytes)
		}
		c.value = append([]byte(nil), v...)
		return nil
	}
}

// WithLockDelay sets the lock's lock-delay when this request creates it
// (ignored for a lock that exists): after a holder's session expires — not
// a clean Unlock — the server grants the lock to nobody for d (0 to 1 h),
// a margin against a holder that was paused past its lease and may still be
// working. Fencing tokens remain the real protection.
func WithLockDelay(d time.Duration) LockOption {
	return func(c *lockConfig) error {
		if d < 0 || d > maxLockDelay {
			return fmt.Errorf("%w: lock delay %v out of bounds [0, %v]", ErrInvalidArgument, d, maxLockDelay)
		}
		c.lockDelay = d
		return nil
	}
}
