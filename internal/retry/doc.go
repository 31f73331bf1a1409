// Package retry holds the retry schedule every lockd client shares: how it
// waits between failed attempts (a Retrier: exponential backoff with full
// jitter, bounded by the caller's context). The Go client (package lockd),
// the Redis backends (package redislock) and a server joining a cluster use
// it, so that one schedule exists, not one per caller. The lease rule (how
// long a confirmed lease may be trusted, when it is renewed) lives beside
// its server half in internal/lease.
package retry
