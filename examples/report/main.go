// Command report builds an expensive report once while other callers wait
// for it, then all of them read the same result.
//
// Five requests for the November report arrive together. Each takes the
// lock "reports/2026-11"; the first is granted it and builds the report,
// the others wait in the server's queue (no polling). The builder stores
// the report and completes the lock (Mutex.Complete): every waiter is
// answered ErrAlreadyDone at once and reads the stored report, and so is
// every request that comes while the mark is kept (the cache's lifetime).
// If the builder crashes, its lease ends and the next waiter builds it.
//
//	lockd serve &
//	go run ./examples/report
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/lockd-dev/lockd"
)

func main() {
	endpoint := flag.String("endpoints", lockd.DefaultEndpoint, "lockd endpoint")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answers, builds, err := run(ctx, *endpoint, 5, func(ctx context.Context) (string, error) {
		// The expensive part: here, summing a month of orders.
		total := 0
		for day := 1; day <= 30; day++ {
			total += day * 1000
		}
		return fmt.Sprintf("November revenue: %d", total), nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("built %d time(s)\n", builds)
	for _, a := range answers {
		fmt.Println(a)
	}
}

// cache stands for where the report is stored (a table, an object store).
type cache struct {
	mu      sync.Mutex
	reports map[string]string
	builds  int
}

func (c *cache) get(key string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.reports[key]
	return r, ok
}

func (c *cache) put(key, report string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reports[key] = report
	c.builds++
}

const key = "reports/2026-11"

// run makes callers concurrent requests, each with its own client and
// session, and returns what each was answered and how often the report
// was built.
func run(ctx context.Context, endpoint string, callers int, build func(context.Context) (string, error)) ([]string, int, error) {
	store := &cache{reports: map[string]string{}}
	answers := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { answers[i], errs[i] = request(ctx, endpoint, fmt.Sprintf("caller-%d", i+1), store, build) })
	}
	wg.Wait()
	return answers, store.builds, errors.Join(errs...)
}

// request returns the report, building it if nobody has.
func request(ctx context.Context, endpoint, name string, store *cache, build func(context.Context) (string, error)) (string, error) {
	c, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	s, err := c.NewSession(ctx, lockd.WithOwner(name))
	if err != nil {
		return "", err
	}
	m := s.NewMutex(key)
	err = m.Lock(ctx)
	var done *lockd.DoneError
	if errors.As(err, &done) {
		r, ok := store.get(key)
		if !ok {
			return "", fmt.Errorf("%s: marked done by %s, but no report stored", name, done.Owner)
		}
		return fmt.Sprintf("%s read (built by %s): %s", name, done.Owner, r), nil
	}
	if err != nil {
		return "", err
	}
	r, err := build(m.Context()) // stops if the lease is lost
	if err != nil {
		_ = m.Unlock(ctx) // the next waiter builds it
		return "", err
	}
	store.put(key, r)
	// The mark is the cache's lifetime: after it, the next request
	// builds a fresh report.
	if err := m.Complete(ctx, time.Hour); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s built: %s", name, r), nil
}
