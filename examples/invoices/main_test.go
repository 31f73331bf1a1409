package main

import (
	"testing"
	"time"

	"github.com/lockd-dev/lockd/lockdtest"
)

// TestInvoicesOncePerPeriod: four servers, clocks skewed by up to 7 s,
// ticking across the turn of November into December, one of them failing
// its first run: each period's invoices are sent exactly once.
func TestInvoicesOncePerPeriod(t *testing.T) {
	srv := lockdtest.New(t)
	runs, err := run(t.Context(), srv.URL(), config{
		start:     time.Date(2026, 11, 30, 23, 59, 50, 0, time.UTC),
		ticks:     20,
		skews:     []time.Duration{0, 3 * time.Second, -4 * time.Second, 7 * time.Second},
		failFirst: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].period != "2026-11" || runs[1].period != "2026-12" {
		t.Fatalf("runs: %+v; want exactly one for 2026-11 and one for 2026-12", runs)
	}
}
