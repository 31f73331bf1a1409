//go:build !unix

package loadgen

import "time"

// CPUTime is unknown (-1) where getrusage is missing.
func CPUTime() time.Duration { return -1 }

// maxRSS is unknown (-1) where getrusage is missing.
func maxRSS() int64 { return -1 }
