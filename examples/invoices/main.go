// Command invoices sends the monthly invoices exactly once per month from
// four servers whose clocks disagree by seconds.
//
// Every server runs the same loop: each tick, it reads its own clock, names
// the billing period ("invoices/2026-11"), and tries to take the lock of
// that name. The first to get it sends the invoices and marks the job done
// with Mutex.Complete; every later try, from any server, however late its
// clock, gets ErrAlreadyDone instead of a grant. A run that fails does not
// complete, so another server runs it. Clocks only decide when a server
// starts to look at a new period, never whether a period runs twice.
//
// The four "servers" here are goroutines with skewed simulated clocks,
// ticking through the turn of a month; in production each is a process
// with its own Client (or `lockd cron`, see docs/cron.md).
//
//	lockd serve &
//	go run ./examples/invoices
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/lockd-dev/lockd"
)

func main() {
	endpoint := flag.String("endpoints", lockd.DefaultEndpoint, "lockd endpoint")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runs, err := run(ctx, *endpoint, config{
		start:     time.Date(2026, 11, 30, 23, 59, 50, 0, time.UTC),
		ticks:     20,
		skews:     []time.Duration{0, 3 * time.Second, -4 * time.Second, 7 * time.Second},
		failFirst: 1,
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		fmt.Printf("%s: invoices sent by %s\n", r.period, r.server)
	}
}

// config is the simulation: servers tick once a simulated second from
// start, each reading start + tick + its skew.
type config struct {
	start     time.Time
	ticks     int
	skews     []time.Duration
	failFirst int // this server's first run fails (-1: none)
}

// invoiceRun is one completed run of the job.
type invoiceRun struct {
	period, server string
}

// ledger stands for the billing database: the runs that sent invoices.
type ledger struct {
	mu   sync.Mutex
	runs []invoiceRun
}

func (l *ledger) record(r invoiceRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, r)
}

// run starts one client and session per server and returns the completed
// runs, sorted by period.
func run(ctx context.Context, endpoint string, cfg config) ([]invoiceRun, error) {
	var l ledger
	var wg sync.WaitGroup
	errs := make([]error, len(cfg.skews))
	for i, skew := range cfg.skews {
		wg.Go(func() {
			errs[i] = server(ctx, endpoint, fmt.Sprintf("server-%d", i+1), skew, i == cfg.failFirst, cfg, &l)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Slice(l.runs, func(i, j int) bool { return l.runs[i].period < l.runs[j].period })
	return l.runs, nil
}

func server(ctx context.Context, endpoint, name string, skew time.Duration, failFirst bool, cfg config, l *ledger) error {
	c, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	s, err := c.NewSession(ctx, lockd.WithOwner(name))
	if err != nil {
		return err
	}
	for tick := range cfg.ticks {
		now := cfg.start.Add(time.Duration(tick)*time.Second + skew) // this server's clock
		period := now.Format("2006-01")
		m := s.NewMutex("invoices/" + period)
		err := m.Lock(ctx)
		if errors.Is(err, lockd.ErrAlreadyDone) {
			continue // another server sent this period's invoices
		}
		if err != nil {
			return fmt.Errorf("%s: lock %s: %w", name, period, err)
		}
		if failFirst {
			// The job fails (a mail server down): no Complete, so the
			// period stays open and another server runs it.
			failFirst = false
			if err := m.Unlock(ctx); err != nil {
				return err
			}
			continue
		}
		l.record(invoiceRun{period: period, server: name}) // send the invoices
		// Mark the period done; only after the effects are durable. The
		// mark outlives the month by far: 400 days.
		if err := m.Complete(ctx, 400*24*time.Hour); err != nil {
			return fmt.Errorf("%s: complete %s: %w", name, period, err)
		}
	}
	return nil
}
