// Package cronjob is the scheduler of `lockd cron`: it turns a cron line
// into periods and decides, on the scheduler's clock, when this server
// attempts each one.
//
// A period runs from a scheduled time to the next; its key (the start in
// UTC) names it the same way on every server. Run attempts a period when
// the clock first shows a time inside its window (the period, or its
// first CatchUp), retries a failed attempt after RetryDelay while the
// window lasts, and never starts a period after its window. A period that
// began before Run started is caught up only when Config.History finds a
// record of an earlier run (a first deploy does not run it). What an
// attempt does (the lock NAME@KEY, the supervised command, the completion
// mark that makes "exactly one success per period" hold across servers) is
// the caller's: cmd/lockd/cron.go. docs/cron.md states the policy for
// users.
//
// The clock is injectable (Config.Now), so the policy is tested inside
// testing/synctest bubbles, clock skew included.
package cronjob
