package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/auth"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Per-identity limits, beside the per-session and cluster-wide caps of the
// FSM: a request rate (token bucket, on the node where a call enters), and
// caps on the live sessions and on the queued Acquire calls in flight of
// each identity (on the leader, which sees them all). With authentication
// off there are no identities: the rate applies per client IP address when
// --rate-limit is set, and the caps do not apply.

// limiter holds the buckets and wait counts. A nil *limiter admits all.
type limiter struct {
	s    *Server
	file *auth.File // nil: authentication off
	def  auth.Limits

	bmu     sync.RWMutex // guards the buckets table; each bucket has its own lock
	buckets map[string]*bucket

	mu    sync.Mutex // guards waits
	waits map[string]int
}

// refusalDelay is how long the answer to a session-stream frame over its
// rate limit is held (less if the stream ends first). A client that
// ignores the refusal and calls again at once, as a flood does, is then
// held to (calls it keeps in flight) / refusalDelay instead of as fast as
// its CPU allows: the Go client keeps at most 128 Acquires in flight on a
// stream, so about 1 300 refusals a second per client, where without the
// delay one client on this 2-core box made the node answer 9 000 a
// second. The held frame costs a parked goroutine and a timer and holds
// its slot of the stream's pool (streamInFlight), so a stream cannot make
// the node hold more than that. Unary calls are answered at once: holding
// them only made an HTTP/1.1 client open more connections, each costing
// the node more than a refusal (bench/flood.sh with LOCKD_STREAM=off).
// KeepAlive and CloseSession are never refused, so never held.
const refusalDelay = 100 * time.Millisecond

// maxBuckets bounds the bucket table (a flood of distinct client IPs):
// when full, idle buckets (full ones) are dropped.
const maxBuckets = 1 << 16

func newLimiter(s *Server, file *auth.File, def auth.Limits) *limiter {
	return &limiter{s: s, file: file, def: def, buckets: map[string]*bucket{}, waits: map[string]int{}}
}

// bucket is a token bucket: rate tokens a second, at most burst.
type bucket struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
	rate   float64
	burst  float64

	// refusal is the answer to a call over this bucket's rate, made at
	// the first one and shared by the next (under a flood, building the
	// message and its error detail for each refused call was most of the
	// refusal's cost); cluster is the cluster id it carries.
	refusal *limitError
	cluster string
}

// limitError is a refusal by a limit: the Connect error, and the same as a
// session-stream frame's error. It is shared by concurrent answers, so
// neither is ever modified once made.
type limitError struct {
	ce *connect.Error
	se *lockdv1.StreamError
	// hold: a refusal by the rate limit, whose stream answer is held
	// refusalDelay.
	hold bool
}

func (e *limitError) Error() string { return e.ce.Error() }

// Unwrap lets connect (and connect.CodeOf) find the Connect error.
func (e *limitError) Unwrap() error { return e.ce }

func (b *bucket) take(now time.Time) bool {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (l *limiter) limitsOf(identity string) auth.Limits {
	if l.file == nil {
		return l.def
	}
	return l.file.LimitsOf(identity, l.def)
}

// exhausted is the answer to a call over a limit; the hit is counted by
// reason (lockd_limit_hits_total).
func (l *limiter) exhausted(reason, msg string) error {
	l.s.metrics.limitHits.WithLabelValues(reason).Inc()
	return l.refusal(msg)
}

// refusal makes the answer to a call over a limit.
func (l *limiter) refusal(msg string) *limitError {
	ce := l.s.apiError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED, msg)
	return &limitError{ce: ce, se: streamError(ce)}
}

// admit takes a token from the caller's bucket. KeepAlive and CloseSession
// are never refused (a limit must not cost a client its lease or keep it
// from cleaning up), nor are calls forwarded by a peer (counted where they
// entered).
func (l *limiter) admit(ctx context.Context, msg any) (func(), error) {
	if l == nil {
		return func() {}, nil
	}
	switch msg.(type) {
	case *lockdv1.KeepAliveRequest, *lockdv1.KeepAliveBatch, *lockdv1.CloseSessionRequest, nil:
		return func() {}, nil
	}
	c := callerOf(ctx)
	if c.forwardedBy != "" || c.forwarded {
		return func() {}, nil
	}
	key := c.identity
	if l.file == nil {
		key = "ip:" + hostOf(c.addr)
	}
	lim := l.limitsOf(c.identity)
	if lim.Rate <= 0 {
		return func() {}, nil
	}
	now := time.Now()
	cluster := l.s.fsm.ClusterID()
	b := l.bucketOf(key, lim, now)
	b.mu.Lock()
	if b.take(now) {
		b.mu.Unlock()
		return func() {}, nil
	}
	refusal := b.refusal
	if refusal == nil || b.cluster != cluster {
		refusal = l.refusal(fmt.Sprintf("rate limit of %s reached (%g requests/s, burst %d); retry later", keyName(key), lim.Rate, max(lim.Burst, 1)))
		refusal.hold = true
		b.refusal, b.cluster = refusal, cluster
	}
	b.mu.Unlock()
	l.s.metrics.rateHits.Inc()
	return nil, refusal
}

// hold waits refusalDelay or until ctx ends: see refusalDelay.
func hold(ctx context.Context) {
	t := time.NewTimer(refusalDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// bucketOf returns key's bucket, made full if it has none. Each bucket has
// its own lock and the table is read under a shared one, so that a flood
// of calls of one identity does not queue the other identities' calls
// behind it.
func (l *limiter) bucketOf(key string, lim auth.Limits, now time.Time) *bucket {
	l.bmu.RLock()
	b := l.buckets[key]
	l.bmu.RUnlock()
	if b != nil {
		return b
	}
	l.bmu.Lock()
	defer l.bmu.Unlock()
	if b := l.buckets[key]; b != nil {
		return b
	}
	if len(l.buckets) >= maxBuckets {
		for k, ob := range l.buckets {
			ob.mu.Lock()
			full := ob.tokens+now.Sub(ob.last).Seconds()*ob.rate >= ob.burst
			ob.mu.Unlock()
			if full {
				// A call still holding it takes a token from a full
				// bucket that a new one replaces: the same as the new.
				delete(l.buckets, k)
			}
		}
	}
	burst := float64(max(lim.Burst, 1))
	b = &bucket{tokens: burst, last: now, rate: lim.Rate, burst: burst}
	l.buckets[key] = b
	return b
}

func keyName(key string) string {
	if key == "" {
		return "anonymous"
	}
	return key
}

// checkSessions refuses a new session of an identity at its session cap
// (on the leader, before proposing).
func (l *limiter) checkSessions(ctx context.Context) error {
	if l == nil || l.file == nil {
		return nil
	}
	id := identityOf(ctx)
	lim := l.limitsOf(id)
	if lim.Sessions > 0 && l.s.fsm.SessionsOf(id) >= lim.Sessions {
		return l.exhausted("sessions", fmt.Sprintf("identity %s has %d live sessions, its cap", id, lim.Sessions))
	}
	return nil
}

// startWait counts a queued Acquire call in flight of the caller's
// identity, refusing one over its cap; the returned func ends it.
func (l *limiter) startWait(ctx context.Context) (func(), error) {
	if l == nil || l.file == nil {
		return func() {}, nil
	}
	id := identityOf(ctx)
	lim := l.limitsOf(id)
	if lim.Waits <= 0 {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waits[id] >= lim.Waits {
		return nil, l.exhausted("waits", fmt.Sprintf("identity %s has %d waiting acquires in flight, its cap", id, lim.Waits))
	}
	l.waits[id]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.waits[id]--; l.waits[id] <= 0 {
			delete(l.waits, id)
		}
	}, nil
}
