//go:build unix

package loadgen

import (
	"runtime"
	"syscall"
	"time"
)

// CPUTime returns the user and system CPU time the process has used, or
// -1 where it cannot be read. The benchmark tools take their CPU per
// operation from two readings of it.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// maxRSS returns the process's peak resident set size in bytes, or -1.
func maxRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	// Linux and the BSDs report kilobytes, Darwin bytes.
	if runtime.GOOS == "darwin" {
		return int64(ru.Maxrss)
	}
	return int64(ru.Maxrss) * 1024
}
