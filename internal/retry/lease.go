package retry

import "time"

// The client deadline rule (docs/design.md, "The client deadline rule"): a client
// gives a lease up at sent + TTL·(1 − drift) − margin, where sent is when
// the first attempt of the request that confirmed it left the client. The
// server (or Redis) started its own TTL when it received the request, after
// sent, so with a client clock at most Drift slow the client gives up
// strictly before the server may expire the lease; margin covers scheduling
// delays between deciding and acting.
const (
	// driftDivisor makes drift TTL/100: 1 %.
	driftDivisor = 100
	// minMargin is the smallest safety margin.
	minMargin = 100 * time.Millisecond
	// marginDivisor makes the margin 2 % of the TTL when that is larger.
	marginDivisor = 50
)

// LeaseDeadline returns the client-side end of a lease of ttl confirmed by a
// request whose first attempt left the client at sent:
// sent + TTL·(1 − 1 %) − max(100 ms, 2 % TTL).
func LeaseDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - Drift(ttl) - max(minMargin, ttl/marginDivisor))
}

// Drift returns the clock drift a lease of ttl allows for: 1 % of it.
func Drift(ttl time.Duration) time.Duration { return ttl / driftDivisor }

// minJeopardy is the shortest wait before a failed renewal is retried.
const minJeopardy = 50 * time.Millisecond

// RenewInterval returns how long after a confirmed renewal (a KeepAlive, a
// Redis extend) was sent the next one goes out: TTL/3, so that two may fail
// before the lease is in danger.
func RenewInterval(ttl time.Duration) time.Duration { return ttl / 3 }

// JeopardyInterval returns how soon a failed renewal is retried:
// max(50 ms, TTL/10), faster than the normal schedule while the deadline
// nears.
func JeopardyInterval(ttl time.Duration) time.Duration { return max(minJeopardy, ttl/10) }
