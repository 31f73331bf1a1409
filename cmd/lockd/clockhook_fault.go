//go:build lockdfault

package main

// clockOffsetEnv is a test hook read only by lockd cron, and only in a
// build with the tag lockdfault: a duration added to the scheduler's
// clock, to play a server whose clock is off. Not documented in the help
// on purpose.
const clockOffsetEnv = "LOCKD_TEST_CLOCK_OFFSET"
