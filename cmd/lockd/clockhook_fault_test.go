//go:build lockdfault

package main

import "time"

// wantOffset is the cron clock offset a lockdfault build takes from
// LOCKD_TEST_CLOCK_OFFSET.
func wantOffset(d time.Duration) time.Duration { return d }
