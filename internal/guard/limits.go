package guard

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd-dev/lockd/internal/auth"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Per-identity limits, beside the per-session and cluster-wide caps of the
// FSM: a request rate (token bucket, on the node where a call enters), and
// caps on the live sessions and on the queued Acquire calls in flight of
// each identity (on the leader, which sees them all), and on the streams
// each identity has open on a node. With authentication off there are no
// identities: the rate applies per client IP address when --rate-limit is
// set, the stream cap per client IP address, and the other caps do not
// apply.

// limiter holds the buckets and the wait and stream counts. A nil
// *limiter admits all. The limits are read from the auth rules in force at
// each call, so a reload applies to the next call.
type limiter struct {
	rules       func() *auth.File // the auth rules in force, nil: auth off
	state       State
	hits        *prometheus.CounterVec // lockd_limit_hits_total, by reason
	rateHits    prometheus.Counter     // hits{reason="rate"}, resolved once
	apiError    func(connect.Code, lockdv1.ErrorReason, string) *connect.Error
	streamError func(error) *lockdv1.StreamError

	def auth.Limits
	// exactCaps: Security.ExactSessionCaps.
	exactCaps bool

	mu      sync.Mutex
	buckets map[string]*list.Element // of *bucket, in lru
	lru     list.List                // buckets, most recently used first
	waits   map[string]int
	streams map[string]int
}

// maxBuckets bounds the bucket table (a flood of distinct client IPs).
// Idle buckets (full again: forgetting one changes nothing) are dropped as
// calls come; past maxBuckets the least recently used one goes even if not
// full, which at worst hands a client that was silent the longest a fresh
// burst.
const maxBuckets = 1 << 16

func newLimiter(def auth.Limits) *limiter {
	return &limiter{def: def, buckets: map[string]*list.Element{}, waits: map[string]int{}, streams: map[string]int{}}
}

// newLimiter returns the limiter of g with the default limits def.
func (g *Guard) newLimiter(def auth.Limits) *limiter {
	l := newLimiter(def)
	l.rules, l.state, l.hits = g.authFile, g.d.State, g.d.LimitHits
	l.rateHits = l.hits.WithLabelValues("rate")
	l.apiError, l.streamError = g.d.APIError, g.d.StreamError
	return l
}

// RefusalDelay is how long the answer to a session-stream frame over its
// rate limit is held (less if the stream ends first). A client that
// ignores the refusal and calls again at once, as a flood does, is then
// held to (calls it keeps in flight) / RefusalDelay instead of as fast as
// its CPU allows: the Go client keeps at most 128 Acquires in flight on a
// stream, so about 1 300 refusals a second per client, where without the
// delay one client on this 2-core box made the node answer 9 000 a
// second. The held frame costs a parked goroutine and a timer and holds
// its slot of the stream's pool (streamInFlight), so a stream cannot make
// the node hold more than that. Unary calls are answered at once: holding
// them only made an HTTP/1.1 client open more connections, each costing
// the node more than a refusal (bench/flood.sh with LOCKD_STREAM=off).
// KeepAlive and CloseSession are never refused, so never held.
const RefusalDelay = 100 * time.Millisecond

// bucket is a token bucket: rate tokens a second, at most burst.
type bucket struct {
	key    string
	tokens float64
	last   time.Time
	rate   float64
	burst  float64

	// refusal is the answer to a call over this bucket's rate, made at
	// the first one and shared by the next (under a flood, building the
	// message and its error detail for each refused call was most of the
	// refusal's cost); cluster is the cluster id it carries.
	refusal *LimitError
	cluster string
}

// LimitError is a refusal by a limit: the Connect error, and the same as a
// session-stream frame's error. It is shared by concurrent answers, so
// neither is ever modified once made.
type LimitError struct {
	ce *connect.Error
	se *lockdv1.StreamError
	// hold: a refusal by the rate limit, whose stream answer is held
	// RefusalDelay.
	hold bool
}

// Error is the Connect error's message.
func (e *LimitError) Error() string { return e.ce.Error() }

// StreamError is the refusal as a session-stream frame's error.
func (e *LimitError) StreamError() *lockdv1.StreamError { return e.se }

// Held reports a refusal by the rate limit, whose session-stream answer is
// held RefusalDelay (Hold).
func (e *LimitError) Held() bool { return e.hold }

// Unwrap lets connect (and connect.CodeOf) find the Connect error.
func (e *LimitError) Unwrap() error { return e.ce }

func (b *bucket) take(now time.Time) bool {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// full reports whether the bucket has refilled: dropping it and making a
// new one later gives the same answers.
func (b *bucket) full(now time.Time) bool {
	return b.tokens+now.Sub(b.last).Seconds()*b.rate >= b.burst
}

func (l *limiter) limitsOf(identity string) auth.Limits {
	f := l.rules()
	if f == nil {
		return l.def
	}
	return f.LimitsOf(identity, l.def)
}

// exhausted is the answer to a call over a limit; the hit is counted by
// reason (lockd_limit_hits_total).
func (l *limiter) exhausted(reason, msg string) error {
	l.hits.WithLabelValues(reason).Inc()
	return l.refusal(msg)
}

// refusal makes the answer to a call over a limit.
func (l *limiter) refusal(msg string) *LimitError {
	ce := l.apiError(connect.CodeResourceExhausted, lockdv1.ErrorReason_ERROR_REASON_RATE_LIMITED, msg)
	return &LimitError{ce: ce, se: l.streamError(ce)}
}

// admit takes a token from the caller's bucket. KeepAlive and CloseSession
// are never refused (a limit must not cost a client its lease or keep it
// from cleaning up), nor are calls forwarded by a peer (counted where they
// entered). A watch also takes one of the caller's stream slots, which the
// returned func frees when the watch ends.
func (l *limiter) admit(ctx context.Context, msg any) (func(), error) {
	if l == nil {
		return func() {}, nil
	}
	switch msg.(type) {
	case *lockdv1.KeepAliveRequest, *lockdv1.KeepAliveBatch, *lockdv1.CloseSessionRequest, nil:
		return func() {}, nil
	}
	c := callerOf(ctx)
	// A forwarded call was charged where it entered. Watches are never
	// forwarded, so a watch takes a stream slot whatever its headers say
	// (without auth the forwarded header is the client's word).
	if c.forwardedBy == "" && !c.forwarded {
		if err := l.rate(c); err != nil {
			return nil, err
		}
	}
	if _, ok := msg.(*lockdv1.WatchRequest); ok {
		return l.startStream(ctx)
	}
	return func() {}, nil
}

// rate takes a token from the bucket of c: its identity or, without auth,
// its IP address.
func (l *limiter) rate(c caller) error {
	key := c.identity
	if l.rules() == nil {
		key = "ip:" + hostOf(c.addr)
	}
	lim := l.limitsOf(c.identity)
	if lim.Rate <= 0 {
		return nil
	}
	burst := float64(max(lim.Burst, 1))
	now := time.Now()
	cluster := l.state.ClusterID()
	l.mu.Lock()
	b := l.bucketLocked(key, lim.Rate, burst, now)
	if b.take(now) {
		l.mu.Unlock()
		return nil
	}
	refusal := b.refusal
	if refusal == nil || b.cluster != cluster {
		refusal = l.refusal(fmt.Sprintf("rate limit of %s reached (%g requests/s, burst %d); retry later", keyName(key), lim.Rate, max(lim.Burst, 1)))
		refusal.hold = true
		b.refusal, b.cluster = refusal, cluster
	}
	l.mu.Unlock()
	l.rateHits.Inc()
	return refusal
}

// Hold waits RefusalDelay or until ctx ends: how long the session-stream
// answer of a refusal by the rate limit (LimitError.Held) is held.
func Hold(ctx context.Context) {
	t := time.NewTimer(RefusalDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// bucketLocked returns key's bucket with rate and burst (a reload may have
// changed them), most recently used now, after dropping the idle buckets
// at the cold end of the list (each bucket is dropped once: amortized
// constant time per call).
func (l *limiter) bucketLocked(key string, rate, burst float64, now time.Time) *bucket {
	for e := l.lru.Back(); e != nil && e.Value.(*bucket).full(now); e = l.lru.Back() {
		l.dropLocked(e)
	}
	if e := l.buckets[key]; e != nil {
		l.lru.MoveToFront(e)
		b := e.Value.(*bucket)
		if b.rate != rate || b.burst != burst {
			b.refusal = nil // its message names the old limits
		}
		b.rate, b.burst, b.tokens = rate, burst, min(b.tokens, burst)
		return b
	}
	if len(l.buckets) >= maxBuckets {
		l.dropLocked(l.lru.Back())
	}
	b := &bucket{key: key, tokens: burst, last: now, rate: rate, burst: burst}
	l.buckets[key] = l.lru.PushFront(b)
	return b
}

func (l *limiter) dropLocked(e *list.Element) {
	delete(l.buckets, e.Value.(*bucket).key)
	l.lru.Remove(e)
}

// startStream counts an open stream of the caller (session stream or
// watch) on this node, refusing one over its cap; the returned func ends
// it. The key is the caller's identity or, without valid credentials
// (authentication off, or refused later), its IP address.
func (l *limiter) startStream(ctx context.Context) (func(), error) {
	if l == nil {
		return func() {}, nil
	}
	c := callerOf(ctx)
	key, lim := "ip:"+hostOf(c.addr), l.def
	if c.known {
		key, lim = c.identity, l.limitsOf(c.identity)
	}
	if lim.Streams <= 0 {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streams[key] >= lim.Streams {
		return nil, l.exhausted("streams", fmt.Sprintf("%s has %d streams open on this node, its cap (--max-streams-per-identity, limit streams=)", keyName(key), lim.Streams))
	}
	l.streams[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.streams[key]--; l.streams[key] <= 0 {
				delete(l.streams, key)
			}
		})
	}, nil
}

func keyName(key string) string {
	if key == "" {
		return "anonymous"
	}
	return key
}

// checkSessions refuses a new session of an identity at its session cap
// (on the leader, before proposing: no Raft write for a refusal), and
// returns the cap for the command, which Apply enforces exactly (0: none;
// always 0 without exactCaps): creations proposed together all pass this
// check, and Apply counts them one after another.
func (l *limiter) checkSessions(ctx context.Context) (uint32, error) {
	if l == nil || l.rules() == nil {
		return 0, nil
	}
	id := IdentityOf(ctx)
	lim := l.limitsOf(id)
	if id == "" || lim.Sessions <= 0 {
		return 0, nil
	}
	if l.state.SessionsOf(id) >= lim.Sessions {
		return 0, l.exhausted("sessions", fmt.Sprintf("identity %s has %d live sessions, its cap", id, lim.Sessions))
	}
	if !l.exactCaps {
		return 0, nil
	}
	return uint32(min(uint64(lim.Sessions), math.MaxUint32)), nil
}

// startWait counts a queued Acquire call in flight of the caller's
// identity, refusing one over its cap; the returned func ends it.
func (l *limiter) startWait(ctx context.Context) (func(), error) {
	if l == nil || l.rules() == nil {
		return func() {}, nil
	}
	id := IdentityOf(ctx)
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

// CheckSessions refuses a new session of the caller in ctx at its
// identity's session cap (call it on the leader, before proposing), and
// returns the cap CreateSession carries for Apply (0: none).
func (g *Guard) CheckSessions(ctx context.Context) (uint32, error) {
	return g.limits.checkSessions(ctx)
}

// StartWait counts a queued Acquire call in flight of the caller's
// identity, refusing one over its cap; the returned func ends it.
func (g *Guard) StartWait(ctx context.Context) (func(), error) { return g.limits.startWait(ctx) }

// MaxHold returns the hold budget ceiling of the caller in ctx from the auth
// rules (0: none, also without an auth file). The leader puts it in the
// Acquire command, and Apply caps the hold's budget with it.
func (g *Guard) MaxHold(ctx context.Context) time.Duration {
	l := g.limits
	if l == nil || l.rules() == nil {
		return 0
	}
	return l.limitsOf(IdentityOf(ctx)).MaxHold
}
