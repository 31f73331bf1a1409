// Command memfill builds a big lock table on a lockd node through the
// public Go client, for bench/memory.sh: --sessions sessions spread over
// --clients clients (each its own connections and session stream), each
// session holding --locks locks, --inflight TryLock calls in flight per
// client. Once every lock is held it creates the --ready file and keeps the
// sessions alive until --hold passes or it is signalled; then it exits
// without closing them (the server expires them), so a measurement of the
// server never includes the cost of tearing the table down.
//
//	memfill --endpoint URL [--sessions 1000] [--locks 1000] [--clients 10]
//	        [--inflight 64] [--ttl 60s] [--timeout 30s] [--build-limit 20m]
//	        [--hold 10m] [--ready FILE]
//
// Progress (locks held, every 5 s) goes to stderr; the last line on stdout
// is "built N locks in S s".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "memfill: %v\n", err)
		}
		os.Exit(1)
	}
}

type options struct {
	endpoint                           string
	sessions, locks, clients, inflight int
	ttl, timeout, buildLimit, hold     time.Duration
	ready                              string
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("memfill", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.endpoint, "endpoint", "", "lockd API URL")
	fs.IntVar(&o.sessions, "sessions", 1000, "sessions to open")
	fs.IntVar(&o.locks, "locks", 1000, "locks each session holds")
	fs.IntVar(&o.clients, "clients", 10, "clients the sessions are spread over")
	fs.IntVar(&o.inflight, "inflight", 64, "TryLock calls in flight per client")
	fs.DurationVar(&o.ttl, "ttl", 60*time.Second, "sessions' TTL")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on one call")
	fs.DurationVar(&o.buildLimit, "build-limit", 20*time.Minute, "give up building after this long")
	fs.DurationVar(&o.hold, "hold", 10*time.Minute, "keep the sessions alive this long after building")
	fs.StringVar(&o.ready, "ready", "", "create this file once every lock is held")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.endpoint == "" || o.sessions < 1 || o.locks < 1 || o.clients < 1 || o.inflight < 1 {
		return errors.New("want --endpoint and positive --sessions, --locks, --clients, --inflight")
	}
	var held atomic.Int64
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, o.buildLimit)
	defer cancel()
	stopProgress := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				fmt.Fprintf(os.Stderr, "memfill: %d locks held after %.0f s\n", held.Load(), time.Since(start).Seconds())
			}
		}
	}()
	clients, err := build(bctx, &o, &held)
	close(stopProgress)
	defer func() {
		for _, c := range clients {
			_ = c.Close(context.Background())
		}
	}()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "built %d locks in %.1f s\n", held.Load(), time.Since(start).Seconds())
	if o.ready != "" {
		if err := os.WriteFile(o.ready, nil, 0o644); err != nil {
			return fmt.Errorf("ready file: %w", err)
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(o.hold):
	}
	return nil
}

// build opens the clients and sessions and takes every lock. Session i
// holds locks "mem/s<i>/<j>".
func build(ctx context.Context, o *options, held *atomic.Int64) ([]*lockd.Client, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		clients  []*lockd.Client
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	for c := range o.clients {
		cl, err := lockd.New(lockd.WithEndpoints(o.endpoint))
		if err != nil {
			return clients, fmt.Errorf("client: %w", err)
		}
		clients = append(clients, cl)
		// This client's work: (session, lock) pairs, session by session.
		var mine []int
		for s := c; s < o.sessions; s += o.clients {
			mine = append(mine, s)
		}
		wg.Go(func() {
			var next atomic.Int64
			total := int64(len(mine) * o.locks)
			sessions := make([]*lockd.Session, len(mine))
			var mu sync.Mutex
			session := func(k int) (*lockd.Session, error) {
				mu.Lock()
				defer mu.Unlock()
				if sessions[k] != nil {
					return sessions[k], nil
				}
				sctx, scancel := context.WithTimeout(ctx, o.timeout)
				defer scancel()
				s, err := cl.NewSession(sctx, lockd.WithTTL(o.ttl), lockd.WithOwner("memfill"))
				if err != nil {
					return nil, fmt.Errorf("session: %w", err)
				}
				sessions[k] = s
				return s, nil
			}
			var inner sync.WaitGroup
			for range o.inflight {
				inner.Go(func() {
					for ctx.Err() == nil {
						i := next.Add(1) - 1
						if i >= total {
							return
						}
						k, j := int(i)/o.locks, int(i)%o.locks
						s, err := session(k)
						if err != nil {
							fail(err)
							return
						}
						actx, acancel := context.WithTimeout(ctx, o.timeout)
						err = s.NewMutex(fmt.Sprintf("mem/s%04d/%04d", mine[k], j)).TryLock(actx)
						acancel()
						if err != nil {
							fail(fmt.Errorf("lock %d of session %d: %w", j, mine[k], err))
							return
						}
						held.Add(1)
					}
				})
			}
			inner.Wait()
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return clients, firstErr
}
