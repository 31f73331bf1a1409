package lease

import "time"

// The lease rule, both halves in one place (docs/design.md, "The client
// deadline rule"). The safety invariant: for the same lease, the client
// gives it up strictly before any server may expire it, so a lock holder
// stops acting on a lock before another session can be granted it.
//
//   - Server half (ServerExpiry): the leader starts a lease's TTL when it
//     receives the request that created or renewed it, on its own
//     monotonic clock, and expires it no sooner than received + TTL +
//     grace. A new leader restarts every deadline in full (Promote), so a
//     leader change only makes a lease last longer.
//   - Client half (ClientDeadline): the client counts from sent, when the
//     first attempt of that request left it (before the server received
//     it), and gives the lease up at sent + TTL·(1 − 1 %) − max(100 ms,
//     2 % TTL).
//
// With a client clock at most Drift (1 %) slow against the server's, the
// client's deadline comes, in real time, before sent + TTL ≤ received +
// TTL ≤ the server's expiry; the margin covers the scheduling delay between
// the client deciding and acting. TestRuleClientGivesUpFirst checks it
// across TTLs, drift, transit delays and grace.

const (
	// driftDivisor makes drift TTL/100: 1 %.
	driftDivisor = 100
	// minMargin is the smallest safety margin.
	minMargin = 100 * time.Millisecond
	// marginDivisor makes the margin 2 % of the TTL when that is larger.
	marginDivisor = 50
)

// ClientDeadline returns the client-side end of a lease of ttl confirmed by
// a request whose first attempt left the client at sent:
// sent + TTL·(1 − 1 %) − max(100 ms, 2 % TTL).
func ClientDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - Drift(ttl) - max(minMargin, ttl/marginDivisor))
}

// ServerExpiry returns the earliest time the leader may expire a lease of
// ttl whose creating or renewing request it received at received, with the
// leader's grace added.
func ServerExpiry(received time.Time, ttl, grace time.Duration) time.Time {
	return received.Add(ttl + grace)
}

// Hold budgets follow the same rule (docs/lock-semantics.md). Server half
// (ServerHoldEnd): the leader starts a hold's budget when it applies the
// grant, on its monotonic clock, and ends the hold no sooner than applied +
// budget; a new leader restarts every budget in full from its own
// establish time. Client half (ClientHoldDeadline): the client counts from
// the send time of a call known to precede the grant (the first attempt of
// the latest Acquire call the leader answered "queued", or of the call that
// was granted at once) and stops believing at sent + budget·(1 − 1 %) −
// max(100 ms, 2 % budget): the same formula as a lease's, so the same
// drift and margin hold. TestRuleHoldClientGivesUpFirst checks it.

// ClientHoldDeadline returns the client-side end of a hold of budget whose
// grant came after a call sent at sent: the lease formula, with the budget
// as the TTL.
func ClientHoldDeadline(sent time.Time, budget time.Duration) time.Time {
	return ClientDeadline(sent, budget)
}

// ServerHoldEnd returns the earliest time the leader may end a hold of
// budget whose grant it applied (or whose budget it restarted on taking
// leadership) at applied.
func ServerHoldEnd(applied time.Time, budget time.Duration) time.Time {
	return applied.Add(budget)
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
