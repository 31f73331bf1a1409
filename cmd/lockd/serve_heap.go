package main

import (
	"log/slog"
	"os"
	"runtime"

	"github.com/lockd-dev/lockd/internal/heapcap"
)

// startHeapCap keeps the heap within --heap-headroom-mib (or a quarter) of
// what is live (internal/heapcap), unless it is 0 or the environment sets
// Go's own knobs, which then rule alone. It returns a func that stops it,
// or nil. It starts once the node has restored its state.
func startHeapCap(mib int, logger *slog.Logger) func() {
	if mib == 0 {
		return nil
	}
	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		if os.Getenv(env) != "" {
			logger.Info("heap headroom off: the environment sets "+env, "env", env)
			return nil
		}
	}
	c := heapcap.Start(uint64(mib) << 20)
	// One collection now, so the limit follows the state just restored
	// and what lies above it goes back to the operating system, even if
	// the node stays idle.
	runtime.GC()
	return c.Stop
}
