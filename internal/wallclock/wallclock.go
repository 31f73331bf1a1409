// Package wallclock is the lockd server's one reader of wall-clock time.
//
// lockd's safety does not depend on wall time: leases, timers and
// deadlines use Go's monotonic clock (time.Now, time.Since, timers), and
// the state machine's Apply reads no clock at all. Wall time is read only
// for what people and other programs look at or compare across machines:
// the times recorded in the lock table (granted at, queued at, completed
// at, shown by the dashboard and lockd ls), the epoch that starts a new
// cluster's fencing tokens, and metrics of those times. Every such read in
// internal/server, internal/api and internal/node goes through Now, and a
// test (scan_test.go) keeps it
// that way, so that a test can move one node's wall clock and see that
// nothing safe changes.
//
// The offset is test-only and compiled in only with the build tag
// lockdfault (the chaos tool builds lockd with it; release builds leave it
// out, so a release binary reads no such variable): then, when the
// environment variable named by EnvOffsetFile names a file, Now adds the
// Go duration written in it ("5m", "-3m30s"; missing, empty or unreadable:
// 0), re-read at every call, so a writer changes the clock at once. The
// variable is not part of lockd's interface; the chaos tool's
// node-clock-jump fault uses it.
package wallclock

import (
	"os"
	"strings"
	"sync"
	"time"
)

// EnvOffsetFile names the environment variable with the path of the
// offset file (tests only, and only in a build with the tag lockdfault).
const EnvOffsetFile = "LOCKD_TEST_WALL_OFFSET_FILE"

var (
	pathOnce sync.Once
	path     string
)

// Now returns the wall-clock time, moved by the test offset if one is
// set. It carries no monotonic reading, so that comparing two results
// compares wall times: measure durations with time.Now instead.
func Now() time.Time {
	pathOnce.Do(func() { path = offsetPath() })
	now := time.Now().Round(0)
	if path == "" {
		return now
	}
	return now.Add(offset(path))
}

// offset reads the duration in the file at p; 0 when there is none.
func offset(p string) time.Duration {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return d
}
