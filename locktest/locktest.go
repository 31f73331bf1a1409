// Package locktest is a conformance suite for lockd.Backend
// implementations: one set of cases, run against every backend (lockd
// itself, and the Redis and Redlock backends of package redislock), so
// that application code written against lockd.Locker behaves the same
// whichever backend it is given.
//
// A backend declares the capabilities it lacks (Target.Lacks). Only the
// cases needing those are skipped, with a message naming the declaration,
// and the suite checks that a declared gap is a real, loud one (an
// operation failing with errors.ErrUnsupported, or no token at all), never
// a silent fake.
package locktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
)

// Capability is an optional feature of a backend.
type Capability string

// Capabilities a backend may lack.
const (
	// Tokens: every grant carries a fencing token, strictly above every
	// earlier grant's on the same lock. A backend without them must return
	// 0 from Token, also while held.
	Tokens Capability = "tokens"
	// Semaphores: NewSemaphore works. A backend without them must fail its
	// acquires with errors.ErrUnsupported.
	Semaphores Capability = "semaphores"
	// RWMutexes: the backend implements lockd.RWBackend. A backend without
	// them must not.
	RWMutexes Capability = "rwmutexes"
)

// Target is a backend under test.
type Target struct {
	// Open returns a new client of the backend, independent of the others
	// it returned (for lockd a new session, for Redis a new Client), so
	// that locks taken through two of them contend. Open registers its own
	// cleanup with t.Cleanup.
	Open func(t *testing.T) lockd.Backend
	// Lacks declares the capabilities the backend does not have.
	Lacks []Capability
}

// timeout bounds every case.
const timeout = 20 * time.Second

// Run runs the suite against target, each case as a subtest on fresh lock
// names.
func Run(t *testing.T, target Target) {
	var seq atomic.Int64
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.needs != "" && slices.Contains(target.Lacks, c.needs) {
				if c.lacking == nil {
					t.Skipf("backend declares it lacks %q", c.needs)
				}
				e := &env{t: t, target: target, name: fmt.Sprintf("locktest/%s/%d/%d", c.name, time.Now().UnixNano(), seq.Add(1))}
				c.lacking(e)
				t.Skipf("backend declares it lacks %q (checked that it really does)", c.needs)
			}
			e := &env{t: t, target: target, name: fmt.Sprintf("locktest/%s/%d/%d", c.name, time.Now().UnixNano(), seq.Add(1))}
			c.run(e)
		})
	}
}

type env struct {
	t      *testing.T
	target Target
	name   string // a lock name unique to the case
}

func (e *env) open() lockd.Backend { return e.target.Open(e.t) }

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	e.t.Cleanup(cancel)
	return ctx
}

// must fails the case on err.
func (e *env) must(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

type testCase struct {
	name    string
	needs   Capability
	run     func(e *env)
	lacking func(e *env) // checks a declared gap
}

var cases = []testCase{
	{name: "mutex/exclusive", run: func(e *env) {
		ctx := e.ctx()
		a, b := e.open().NewMutex(e.name), e.open().NewMutex(e.name)
		e.must("a Lock", a.Lock(ctx))
		if err := b.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
			e.t.Fatalf("b TryLock while a holds: got %v, want ErrBusy", err)
		}
		e.must("a Unlock", a.Unlock(ctx))
		e.must("b TryLock after a's Unlock", b.TryLock(ctx))
		e.must("b Unlock", b.Unlock(ctx))
	}},
	{name: "mutex/handoff", run: func(e *env) {
		ctx := e.ctx()
		a, b := e.open().NewMutex(e.name), e.open().NewMutex(e.name)
		e.must("a Lock", a.Lock(ctx))
		got := make(chan error, 1)
		go func() { got <- b.Lock(ctx) }()
		select {
		case err := <-got:
			e.t.Fatalf("b Lock returned while a holds: %v", err)
		case <-time.After(100 * time.Millisecond): // b is waiting (or about to)
		}
		e.must("a Unlock", a.Unlock(ctx))
		select {
		case err := <-got:
			e.must("b Lock after a's Unlock", err)
		case <-time.After(5 * time.Second):
			e.t.Fatal("b not granted within 5 s of a's Unlock")
		}
		e.must("b Unlock", b.Unlock(ctx))
	}},
	{name: "mutex/wait-cancelled", run: func(e *env) {
		ctx := e.ctx()
		a, b, c := e.open().NewMutex(e.name), e.open().NewMutex(e.name), e.open().NewMutex(e.name)
		e.must("a Lock", a.Lock(ctx))
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := b.Lock(wctx); !errors.Is(err, context.DeadlineExceeded) {
			e.t.Fatalf("b Lock until its deadline: got %v, want DeadlineExceeded", err)
		}
		if err := a.Err(); err != nil {
			e.t.Fatalf("a's hold after b gave up: %v", err)
		}
		if b.Token() != 0 || b.Err() == nil {
			e.t.Fatalf("b after a cancelled wait: token %d, Err %v; want 0 and not held", b.Token(), b.Err())
		}
		e.must("a Unlock", a.Unlock(ctx))
		// The abandoned wait left nothing behind.
		e.must("c TryLock", c.TryLock(ctx))
		e.must("c Unlock", c.Unlock(ctx))
	}},
	{name: "mutex/not-reentrant", run: func(e *env) {
		ctx := e.ctx()
		m := e.open().NewMutex(e.name)
		e.must("Lock", m.Lock(ctx))
		if err := m.Lock(ctx); !errors.Is(err, lockd.ErrAlreadyHeld) {
			e.t.Fatalf("second Lock: got %v, want ErrAlreadyHeld", err)
		}
		if err := m.TryLock(ctx); !errors.Is(err, lockd.ErrAlreadyHeld) {
			e.t.Fatalf("TryLock while held: got %v, want ErrAlreadyHeld", err)
		}
		e.must("Unlock", m.Unlock(ctx))
	}},
	{name: "mutex/unlock-not-held", run: func(e *env) {
		ctx := e.ctx()
		m := e.open().NewMutex(e.name)
		if err := m.Unlock(ctx); !errors.Is(err, lockd.ErrNotHeld) {
			e.t.Fatalf("Unlock never locked: got %v, want ErrNotHeld", err)
		}
		e.must("Lock", m.Lock(ctx))
		e.must("Unlock", m.Unlock(ctx))
		if err := m.Unlock(ctx); !errors.Is(err, lockd.ErrNotHeld) {
			e.t.Fatalf("second Unlock: got %v, want ErrNotHeld", err)
		}
	}},
	{name: "mutex/context", run: func(e *env) {
		ctx := e.ctx()
		m := e.open().NewMutex(e.name)
		if m.Name() != e.name {
			e.t.Errorf("Name: got %q, want %q", m.Name(), e.name)
		}
		select {
		case <-m.Done():
		default:
			e.t.Error("Done of a lock never held is open")
		}
		if !errors.Is(m.Err(), lockd.ErrNotHeld) {
			e.t.Errorf("Err never held: got %v, want ErrNotHeld", m.Err())
		}
		e.must("Lock", m.Lock(ctx))
		hold := m.Context()
		if m.Err() != nil || hold.Err() != nil {
			e.t.Fatalf("held: Err %v, Context().Err() %v; want nil", m.Err(), hold.Err())
		}
		select {
		case <-m.Done():
			e.t.Fatal("Done closed while held")
		default:
		}
		e.must("Unlock", m.Unlock(ctx))
		select {
		case <-hold.Done():
		default:
			e.t.Fatal("the hold's Context not cancelled by Unlock")
		}
		if !errors.Is(context.Cause(hold), lockd.ErrNotHeld) || !errors.Is(m.Err(), lockd.ErrNotHeld) {
			e.t.Errorf("after Unlock: cause %v, Err %v; want ErrNotHeld", context.Cause(hold), m.Err())
		}
	}},
	{name: "mutex/invalid-name", run: func(e *env) {
		ctx := e.ctx()
		for _, name := range []string{"", "bad\x00name", string(make([]byte, 513))} {
			if err := e.open().NewMutex(name).TryLock(ctx); !errors.Is(err, lockd.ErrInvalidArgument) {
				e.t.Errorf("TryLock of name %q: got %v, want ErrInvalidArgument", name, err)
			}
		}
	}},
	{name: "mutex/exclusion", run: func(e *env) {
		ctx := e.ctx()
		const workers, rounds = 8, 10
		var inside, peak atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			m := e.open().NewMutex(e.name)
			wg.Go(func() {
				for range rounds {
					if err := m.Lock(ctx); err != nil {
						errs <- err
						return
					}
					for n := inside.Add(1); ; {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					time.Sleep(time.Millisecond) // hold it a moment: overlap would show
					inside.Add(-1)
					if err := m.Unlock(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			e.t.Error(err)
		}
		if peak.Load() != 1 {
			e.t.Fatalf("at most %d holders at once, want 1", peak.Load())
		}
	}},
	{name: "tokens/increasing", needs: Tokens, run: func(e *env) {
		ctx := e.ctx()
		var last uint64
		for i := range 6 {
			m := e.open().NewMutex(e.name)
			if m.Token() != 0 {
				e.t.Fatalf("Token before Lock: %d", m.Token())
			}
			e.must("Lock", m.Lock(ctx))
			if m.Token() <= last {
				e.t.Fatalf("grant %d token %d, not above %d", i, m.Token(), last)
			}
			last = m.Token()
			e.must("Unlock", m.Unlock(ctx))
			if m.Token() != 0 {
				e.t.Fatalf("Token after Unlock: %d", m.Token())
			}
		}
	}, lacking: func(e *env) {
		ctx := e.ctx()
		m := e.open().NewMutex(e.name)
		e.must("Lock", m.Lock(ctx))
		if m.Token() != 0 {
			e.t.Errorf("backend without tokens gave token %d; it must not fake one", m.Token())
		}
		e.must("Unlock", m.Unlock(ctx))
	}},
	{name: "semaphore/permits", needs: Semaphores, run: func(e *env) {
		ctx := e.ctx()
		var held []lockd.Locker
		for i := range 3 {
			s := e.open().NewSemaphore(e.name, 3)
			e.must(fmt.Sprintf("permit %d", i), s.TryLock(ctx))
			held = append(held, s)
		}
		fourth := e.open().NewSemaphore(e.name, 3)
		if err := fourth.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
			e.t.Fatalf("fourth of 3 permits: got %v, want ErrBusy", err)
		}
		if err := e.open().NewSemaphore(e.name, 4).TryLock(ctx); !errors.Is(err, lockd.ErrLimitMismatch) {
			e.t.Fatalf("semaphore of 4 on one of 3: got %v, want ErrLimitMismatch", err)
		}
		e.must("Unlock", held[0].Unlock(ctx))
		e.must("fourth Lock after a release", fourth.Lock(ctx))
		for _, s := range append(held[1:], fourth) {
			e.must("Unlock", s.Unlock(ctx))
		}
	}, lacking: func(e *env) {
		err := e.open().NewSemaphore(e.name, 3).TryLock(e.ctx())
		if !errors.Is(err, errors.ErrUnsupported) {
			e.t.Errorf("semaphore on a backend without them: got %v, want errors.ErrUnsupported", err)
		}
	}},
	{name: "rwmutex/readers-writers", needs: RWMutexes, run: func(e *env) {
		ctx := e.ctx()
		rw := func() lockd.RWLocker {
			b, ok := e.open().(lockd.RWBackend)
			if !ok {
				e.t.Fatal("backend does not implement lockd.RWBackend and does not declare it lacks rwmutexes")
			}
			return b.NewRWMutex(e.name)
		}
		r1, r2, w := rw(), rw(), rw()
		e.must("r1 RLock", r1.RLock(ctx))
		e.must("r2 TryRLock beside r1", r2.TryRLock(ctx))
		if err := w.TryLock(ctx); !errors.Is(err, lockd.ErrBusy) {
			e.t.Fatalf("writer TryLock beside readers: got %v, want ErrBusy", err)
		}
		e.must("r1 RUnlock", r1.RUnlock(ctx))
		e.must("r2 RUnlock", r2.RUnlock(ctx))
		e.must("writer TryLock", w.TryLock(ctx))
		if err := r1.TryRLock(ctx); !errors.Is(err, lockd.ErrBusy) {
			e.t.Fatalf("reader TryRLock beside a writer: got %v, want ErrBusy", err)
		}
		e.must("writer Unlock", w.Unlock(ctx))
	}, lacking: func(e *env) {
		if _, ok := e.open().(lockd.RWBackend); ok {
			e.t.Error("backend declares it lacks rwmutexes but implements lockd.RWBackend")
		}
	}},
}
