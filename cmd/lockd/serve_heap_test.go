package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

func TestServeRefusesBadHeapHeadroom(t *testing.T) {
	for _, v := range []string{"-1", "1048577", "17592186044416"} {
		err := (&ServeCommand{Stderr: io.Discard}).Run(context.Background(), []string{"--data-dir", t.TempDir(), "--heap-headroom-mib", v})
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--heap-headroom-mib "+v) {
			t.Fatalf("%s: got %v, want a usage error naming --heap-headroom-mib %s", v, err, v)
		}
	}
}

// TestStartHeapCap: the headroom sets a soft memory limit until stopped,
// and leaves Go's knobs alone when it is 0 or the environment sets them.
// Not parallel: it sets the environment and the process's limit.
func TestStartHeapCap(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Skipf("this process already has a memory limit (%d): GOMEMLIMIT set?", got)
	}
	if stop := startHeapCap(0, logger); stop != nil {
		stop()
		t.Fatal("a headroom of 0 started the cap")
	}
	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, "100")
			if stop := startHeapCap(64, logger); stop != nil {
				stop()
				t.Fatalf("%s set in the environment, yet the cap started", env)
			}
		})
	}
	stop := startHeapCap(64, logger)
	if stop == nil {
		t.Fatal("the cap did not start")
	}
	if got := debug.SetMemoryLimit(-1); got == math.MaxInt64 || got < 64<<20 {
		stop()
		t.Fatalf("with the cap: memory limit %d, want the live heap plus at least 64 MiB", got)
	}
	stop()
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("after stop: memory limit %d, want none", got)
	}
}
