// Package cronjob is the scheduler of `lockd cron`: it turns a cron line
// into periods and decides, on the scheduler's clock, when this server
// attempts each one.
//
// A period runs from a scheduled time to the next; its key (the start in
// UTC) names it the same way on every server. Run joins a period when the
// clock first shows a time inside its window (the period, or its first
// CatchUp), and then waits for the period's lock and retries a failed
// attempt after RetryDelay until the period ends (a standby outlasts the
// window). A period that began before Run started is caught up only when
// Config.History finds a record of an earlier run (a first deploy does not
// run it); one reached after its window is joined only when
// Config.Underway finds the fleet at work on it. What an
// attempt does (the lock NAME@KEY, the supervised command, the completion
// mark that makes "exactly one success per period" hold across servers) is
// the caller's: cmd/lockd/cron.go. docs/cron.md states the policy for
// users.
//
// The clock is injectable (Config.Now), so the policy is tested inside
// testing/synctest bubbles, clock skew included.
package cronjob
