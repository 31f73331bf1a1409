// Package retry holds the timing rules every lockd client shares: how it
// waits between failed attempts (a Retrier: exponential backoff with full
// jitter, bounded by the caller's context), how long a confirmed lease may
// be trusted (LeaseDeadline), and when it is renewed (RenewInterval,
// JeopardyInterval). The Go client (package lockd), the
// Redis backends (package redislock) and a server joining a cluster use
// them, so that one schedule and one safety rule exist, not one per caller.
package retry
