package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TestReportBuiltOnce: five callers; the builder waits until the four
// others are queued behind it (so they surely wait), then builds. The
// report is built once; the four waiters read the builder's result.
func TestReportBuiltOnce(t *testing.T) {
	srv := lockdtest.New(t)
	obs, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(context.Background())
	build := func(ctx context.Context) (string, error) {
		// Linearizable reads of the queue, with a deadline: no sleeping.
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			resp, err := obs.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: key}))
			if err != nil {
				return "", err
			}
			if len(resp.Msg.GetLock().GetWaiters()) == 4 {
				return "November revenue: 465000", nil
			}
		}
	}
	answers, builds, err := run(t.Context(), srv.URL(), 5, build)
	if err != nil {
		t.Fatal(err)
	}
	if builds != 1 {
		t.Fatalf("built %d times, want 1", builds)
	}
	built, read := 0, 0
	for _, a := range answers {
		switch {
		case strings.Contains(a, " built: November revenue: 465000"):
			built++
		case strings.Contains(a, " read (built by caller-") && strings.HasSuffix(a, ": November revenue: 465000"):
			read++
		default:
			t.Errorf("answer %q", a)
		}
	}
	if built != 1 || read != 4 {
		t.Errorf("answers %q: want 1 built and 4 read", answers)
	}
}
