//go:build !lockdfault

package main

import "time"

// wantOffset is 0: a release build ignores LOCKD_TEST_CLOCK_OFFSET.
func wantOffset(time.Duration) time.Duration { return 0 }
