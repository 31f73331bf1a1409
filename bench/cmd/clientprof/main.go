// Command clientprof measures lockd's Go client alone on workload (a),
// own locks: --clients workers, each its own lockd.Client and session,
// take and release their own lock against a server running in another
// process, for a warm-up then --duration. It prints pairs/s, this
// process's CPU (user+system, getrusage) per pair and its allocations per
// pair (runtime.MemStats), and writes a CPU profile (--cpuprofile) and an
// allocation profile (--memprofile) of the client only.
//
//	clientprof --endpoint 127.0.0.1:7070 --duration 15s --cpuprofile client.cpu
//	go tool pprof -top clientprof client.cpu
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/loadgen"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "clientprof:", err)
		os.Exit(1)
	}
}

func run() error {
	ep := flag.String("endpoint", "127.0.0.1:7070", "the lockd server")
	clients := flag.Int("clients", 16, "workers, each its own client and session")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured warm-up")
	dur := flag.Duration("duration", 10*time.Second, "measured window")
	maxOps := flag.Int64("max-ops", 10_000_000, "stop a worker after this many pairs")
	cpuf := flag.String("cpuprofile", "", "write a CPU profile of the window here")
	memf := flag.String("memprofile", "", "write an allocation profile here (sampling every 4 KiB, which costs CPU: take it in a run of its own)")
	flag.Parse()
	ctx := context.Background()
	var ms []*lockd.Mutex
	for i := range *clients {
		c, err := lockd.New(lockd.WithEndpoints(*ep))
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		s, err := c.NewSession(ctx, lockd.WithTTL(10*time.Second))
		if err != nil {
			return err
		}
		ms = append(ms, s.NewMutex(fmt.Sprint("clientprof/", os.Getpid(), "/", i)))
	}
	var pairs atomic.Int64
	var stop atomic.Bool
	var failed atomic.Value
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() {
			for n := int64(0); n < *maxOps && !stop.Load(); n++ {
				if err := m.Lock(ctx); err != nil {
					failed.Store(err)
					return
				}
				if err := m.Unlock(ctx); err != nil {
					failed.Store(err)
					return
				}
				pairs.Add(1)
			}
		})
	}
	time.Sleep(*warmup)
	if *memf != "" {
		runtime.MemProfileRate = 4096
	}
	if *cpuf != "" {
		f, err := os.Create(*cpuf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	c0, p0, t0 := loadgen.CPUTime(), pairs.Load(), time.Now()
	time.Sleep(*dur)
	c1, p1, t1 := loadgen.CPUTime(), pairs.Load(), time.Now()
	runtime.ReadMemStats(&m1)
	if *cpuf != "" {
		pprof.StopCPUProfile()
	}
	if *memf != "" {
		f, err := os.Create(*memf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
	}
	stop.Store(true)
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return fmt.Errorf("a worker failed: %w", err)
	}
	n := p1 - p0
	if n == 0 {
		return fmt.Errorf("no pair completed in the window")
	}
	fmt.Printf("pairs/s %.0f  client CPU µs/pair %.1f  allocs/pair %.1f  bytes/pair %.0f\n",
		float64(n)/t1.Sub(t0).Seconds(), float64((c1-c0).Microseconds())/float64(n),
		float64(m1.Mallocs-m0.Mallocs)/float64(n), float64(m1.TotalAlloc-m0.TotalAlloc)/float64(n))
	return nil
}
