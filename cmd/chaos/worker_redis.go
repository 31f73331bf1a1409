package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd"
)

// runRedisWorker is the Go worker on a Redis backend (c.endpoints are
// host:port; one is a single instance, several are Redlock). Redis has no
// session: the worker makes its own "session" for the checker, a run of
// holds that ends at the first error or lost hold, as a lockd session
// would, so that the history reads the same. Each hold is its own holder
// identity (session:n): Redlock's messages carry no token to tell two
// holds of one session apart.
func runRedisWorker(ctx context.Context, c *workerConfig) error {
	ctx, cancel := context.WithDeadline(ctx, c.until)
	defer cancel()
	rep := newReporter(c.register, c.slot)
	var (
		b      lockd.Backend
		closeB func()
	)
	for ctx.Err() == nil {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		var err error
		b, closeB, err = redisBackend(cctx, c.endpoints, c.ttl)
		ccancel()
		if err == nil {
			break
		}
		pause(ctx, 100*time.Millisecond) // Redis down or no quorum: try again
	}
	if b == nil {
		return nil
	}
	defer closeB()
	rng := rand.New(rand.NewPCG(c.seed, uint64(os.Getpid())))
	var opID atomic.Int64
	for n, done := 0, 0; ctx.Err() == nil && done < c.maxOps; n++ {
		session := fmt.Sprintf("%s.%d.%d", c.slot, os.Getpid(), n)
		if rep.send(ctx, Event{Kind: kindOpen, Session: session}) != nil {
			return ctx.Err()
		}
		k, err := c.redisSession(ctx, rep, b, session, rng, &opID)
		done += k
		// The session's holds are over when it ends cleanly; after an
		// error one may live on Redis until its key expires: unknown.
		id := opID.Add(1)
		_ = rep.send(context.Background(), Event{Kind: kindInvoke, Op: opClose, OpID: id, Session: session})
		_ = rep.send(context.Background(), Event{Kind: kindReturn, Op: opClose, OpID: id, Session: session, Result: result(err)})
		if err != nil {
			pause(ctx, time.Duration(rng.IntN(100))*time.Millisecond)
		}
	}
	return nil
}

// errHoldLost ends a Redis session whose hold was lost.
var errHoldLost = errors.New("hold lost")

// redisSession takes the locks in turn (Lock, critical section, Unlock)
// until an error, a lost hold or the end, and returns the critical
// sections completed and the error that ended it.
func (c *workerConfig) redisSession(ctx context.Context, rep *reporter, b lockd.Backend, session string, rng *rand.Rand, opID *atomic.Int64) (int, error) {
	n := 0
	for h := 0; ctx.Err() == nil && n < c.maxOps; h++ {
		name := c.locks[rng.IntN(len(c.locks))]
		m := b.NewMutex(name)
		id := opID.Add(1)
		if err := rep.send(ctx, Event{Kind: kindInvoke, Op: opAcquire, OpID: id, Session: session, Lock: name}); err != nil {
			return n, err
		}
		lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
		err := m.Lock(lctx)
		lcancel()
		ev := Event{Kind: kindReturn, Op: opAcquire, OpID: id, Session: session, Lock: name, Result: result(err)}
		if err == nil {
			ev.Token = m.Token()
		}
		_ = rep.send(context.Background(), ev)
		if err != nil {
			return n, err
		}
		client := fmt.Sprintf("%s:%d", session, h)
		held := m.Context()
		var watch sync.WaitGroup
		lost := false
		watch.Go(func() {
			<-held.Done()
			if errors.Is(context.Cause(held), lockd.ErrLeaseLost) {
				lost = true
				_ = rep.send(context.Background(), Event{Kind: kindLost, Session: session, Client: client})
			}
		})
		c.critical(ctx, rep, client, session, m, rng)
		id = opID.Add(1)
		_ = rep.send(context.Background(), Event{Kind: kindInvoke, Op: opRelease, OpID: id, Session: session, Lock: name})
		uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = m.Unlock(uctx)
		ucancel()
		_ = rep.send(context.Background(), Event{Kind: kindReturn, Op: opRelease, OpID: id, Session: session, Lock: name, Result: result(err)})
		watch.Wait()
		switch {
		case err != nil:
			return n, err
		case lost:
			return n, errHoldLost
		}
		n++
		pause(ctx, time.Duration(rng.IntN(20))*time.Millisecond)
	}
	return n, nil
}
