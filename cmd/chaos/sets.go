package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd"
)

// fencedHold is what a critical section needs of a hold: its name, its
// token, and whether it is still held (a Mutex, or one name of a set).
type fencedHold interface {
	Name() string
	Token() uint64
	Err() error
}

// setMember is one name of a granted MultiLock, as a fencedHold.
type setMember struct {
	m    *lockd.MultiLock
	name string
}

func (h setMember) Name() string  { return h.name }
func (h setMember) Token() uint64 { return h.m.Tokens()[h.name] }

// Err is the cause the set's hold ended, nil while it is held.
func (h setMember) Err() error {
	ctx := h.m.Context()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	default:
		return nil
	}
}

// setSection takes 2 to 4 of the set names as one MultiLock, runs a fenced
// critical section on each name with that name's token, and releases the
// set. It records the set's acquire as one invoke and one return carrying
// every token: the checker verifies they came from one grant. It reports
// false when an operation failed (the session is then closed).
func (c *workerConfig) setSection(ctx context.Context, rep *reporter, s *lockd.Session, rng *rand.Rand, opID *atomic.Int64) bool {
	k := 2 + rng.IntN(min(4, len(c.setLocks))-1)
	var names []string
	for _, i := range rng.Perm(len(c.setLocks))[:k] {
		names = append(names, c.setLocks[i])
	}
	ml := s.NewMultiLock(names)
	id := opID.Add(1)
	if rep.send(ctx, Event{Kind: kindInvoke, Op: opAcquireMany, OpID: id, Session: s.ID(), Names: names}) != nil {
		return false
	}
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	err := ml.Lock(lctx)
	lcancel()
	ev := Event{Kind: kindReturn, Op: opAcquireMany, OpID: id, Session: s.ID(), Names: names, Result: result(err)}
	if err == nil {
		toks := ml.Tokens()
		for _, n := range names {
			ev.Tokens = append(ev.Tokens, toks[n])
		}
	}
	_ = rep.send(context.Background(), ev)
	if err != nil {
		return false
	}
	for _, n := range names {
		c.critical(ctx, rep, c.slot+":"+s.ID(), s.ID(), setMember{ml, n}, rng)
	}
	id = opID.Add(1)
	_ = rep.send(context.Background(), Event{Kind: kindInvoke, Op: opReleaseMany, OpID: id, Session: s.ID(), Names: names})
	uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = ml.Unlock(uctx)
	ucancel()
	_ = rep.send(context.Background(), Event{Kind: kindReturn, Op: opReleaseMany, OpID: id, Session: s.ID(), Names: names, Result: result(err)})
	return err == nil
}

// pairSide is one session of an inversion pair.
type pairSide struct {
	s     *lockd.Session
	watch sync.WaitGroup
}

// runPair is a lock-order inversion pair: two sessions in one process,
// on two names only they use. Each round, side 0 takes the first name and
// side 1 the second; once both hold, each asks for the other's name at
// about the same moment. The second of the two waits the leader applies
// closes a cycle and must be refused with DEADLOCK in one round trip; the
// refused side releases its name, and the other, granted, writes fenced
// on both names and releases them. Every operation of a round carries the
// round's tag (Pair) for the checker. The sessions live in one process so
// the inversion is deliberate every round, not left to chance.
func runPair(ctx context.Context, c *workerConfig) error {
	ctx, cancel := context.WithDeadline(ctx, c.until)
	defer cancel()
	rep := newReporter(c.register, c.slot)
	cl, err := lockd.New(lockd.WithEndpoints(c.endpoints...), lockd.WithRequestTimeout(time.Second), streamOption())
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	rng := rand.New(rand.NewPCG(c.seed, 0x70616972))
	var opID atomic.Int64
	var sides [2]*pairSide
	closeAll := func() {
		for i, p := range sides {
			if p != nil {
				c.closeSide(rep, p, &opID)
				sides[i] = nil
			}
		}
	}
	defer closeAll()
	for round := 0; ctx.Err() == nil && round < c.maxOps; round++ {
		opened := true
		for i := range sides {
			if sides[i] == nil {
				if sides[i] = c.openSide(ctx, cl, rep); sides[i] == nil {
					opened = false
				}
			}
		}
		if !opened {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		tag := fmt.Sprintf("%s:%d", c.slot, round)
		if !c.pairRound(ctx, rep, sides, [2]string{c.locks[0], c.locks[1]}, tag, rng, &opID) {
			closeAll()
		}
		pause(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
	}
	return nil
}

func (c *workerConfig) openSide(ctx context.Context, cl *lockd.Client, rep *reporter) *pairSide {
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	s, err := cl.NewSession(sctx, lockd.WithTTL(c.ttl), lockd.WithOwner(c.slot))
	scancel()
	if err != nil {
		return nil
	}
	if rep.send(ctx, Event{Kind: kindOpen, Session: s.ID()}) != nil {
		_ = s.Close(context.Background())
		return nil
	}
	p := &pairSide{s: s}
	p.watch.Go(func() {
		<-s.Done()
		if errors.Is(s.Err(), lockd.ErrLeaseLost) {
			_ = rep.send(context.Background(), Event{Kind: kindLost, Session: s.ID(), Client: c.slot + ":" + s.ID()})
		}
	})
	return p
}

func (c *workerConfig) closeSide(rep *reporter, p *pairSide, opID *atomic.Int64) {
	id := opID.Add(1)
	_ = rep.send(context.Background(), Event{Kind: kindInvoke, Op: opClose, OpID: id, Session: p.s.ID()})
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := p.s.Close(cctx)
	ccancel()
	_ = rep.send(context.Background(), Event{Kind: kindReturn, Op: opClose, OpID: id, Session: p.s.ID(), Result: result(err)})
	p.watch.Wait()
}

// pairRound runs one inversion round; false when an operation failed
// other than by the expected DEADLOCK (the sessions are then closed).
func (c *workerConfig) pairRound(ctx context.Context, rep *reporter, sides [2]*pairSide, names [2]string, tag string, rng *rand.Rand, opID *atomic.Int64) bool {
	var first [2]*lockd.Mutex
	var errs [2]error
	var wg sync.WaitGroup
	for i := range sides {
		first[i] = sides[i].s.NewMutex(names[i])
		wg.Go(func() { errs[i] = pairLock(ctx, rep, sides[i].s, first[i], tag, opID) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		for i := range sides {
			if errs[i] == nil {
				pairUnlock(rep, sides[i].s, first[i], tag, opID)
			}
		}
		return false
	}
	// Both hold: ask for the other's name, in a random order a few
	// milliseconds apart (rng is not safe for concurrent use: draw first).
	delays := [2]time.Duration{time.Duration(rng.IntN(5)) * time.Millisecond, time.Duration(rng.IntN(5)) * time.Millisecond}
	var seeds [2]uint64
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	var ok [2]bool
	for i := range sides {
		wg.Go(func() {
			pause(ctx, delays[i])
			s := sides[i].s
			second := s.NewMutex(names[1-i])
			err := pairLock(ctx, rep, s, second, tag, opID)
			if err != nil {
				// Refused (or failed): let go, so the other side is granted.
				ok[i] = errors.Is(err, lockd.ErrDeadlock) && pairUnlock(rep, s, first[i], tag, opID)
				return
			}
			r := rand.New(rand.NewPCG(seeds[i], 1))
			client := c.slot + ":" + s.ID()
			c.critical(ctx, rep, client, s.ID(), first[i], r)
			c.critical(ctx, rep, client, s.ID(), second, r)
			ok[i] = pairUnlock(rep, s, second, tag, opID)
			ok[i] = pairUnlock(rep, s, first[i], tag, opID) && ok[i]
		})
	}
	wg.Wait()
	return ok[0] && ok[1]
}

// pairLock is a recorded Lock of a pair's round; a DEADLOCK refusal is
// recorded as such.
func pairLock(ctx context.Context, rep *reporter, s *lockd.Session, m *lockd.Mutex, tag string, opID *atomic.Int64) error {
	id := opID.Add(1)
	if err := rep.send(ctx, Event{Kind: kindInvoke, Op: opAcquire, OpID: id, Session: s.ID(), Lock: m.Name(), Pair: tag}); err != nil {
		return err
	}
	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	err := m.Lock(lctx)
	lcancel()
	ev := Event{Kind: kindReturn, Op: opAcquire, OpID: id, Session: s.ID(), Lock: m.Name(), Pair: tag, Result: result(err)}
	switch {
	case err == nil:
		ev.Token = m.Token()
	case errors.Is(err, lockd.ErrDeadlock):
		ev.Result, ev.Detail = resDeadlock, err.Error()
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		ev.Detail = detailRunEnded
	}
	_ = rep.send(context.Background(), ev)
	return err
}

// pairUnlock is a recorded Unlock of a pair's round.
func pairUnlock(rep *reporter, s *lockd.Session, m *lockd.Mutex, tag string, opID *atomic.Int64) bool {
	id := opID.Add(1)
	_ = rep.send(context.Background(), Event{Kind: kindInvoke, Op: opRelease, OpID: id, Session: s.ID(), Lock: m.Name(), Pair: tag})
	uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := m.Unlock(uctx)
	ucancel()
	_ = rep.send(context.Background(), Event{Kind: kindReturn, Op: opRelease, OpID: id, Session: s.ID(), Lock: m.Name(), Pair: tag, Result: result(err)})
	return err == nil
}
