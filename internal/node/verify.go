package node

import (
	"sync"
	"sync/atomic"
)

// Verifier shares leadership checks (VerifyLeader) among concurrent
// requests. The lease and read rules need a check that STARTED after the
// request was received: a check that started before could have been
// answered by followers that had not yet elected a newer leader, and a
// KeepAlive would then extend a lease that leader already expired.
//
// So a request never joins a check in flight. It joins the next one, which
// starts when the one in flight ends; every request that arrives meanwhile
// joins the same next check. Under any load at most one check runs and one
// waits, and a request waits for at most two of them. The zero value is
// ready to use.
type Verifier struct {
	mu      sync.Mutex
	running bool   // a check is in flight
	next    *check // the check that starts when the one in flight ends

	checks atomic.Uint64 // checks started, for tests and metrics
}

// check is one leadership check shared by the requests that joined it
// before it started.
type check struct {
	start chan struct{} // closed when the check may start (its owner runs it)
	done  chan struct{} // closed when err is set
	err   error
}

// Do returns the result of a check that starts after do was called. run is
// the check itself; the caller that runs a check uses its own run (every
// caller passes the same check).
func (v *Verifier) Do(run func() error) error {
	v.mu.Lock()
	if !v.running {
		v.running = true
		c := &check{done: make(chan struct{})}
		v.mu.Unlock()
		v.run(c, run)
		return c.err
	}
	owner := v.next == nil
	if owner {
		v.next = &check{start: make(chan struct{}), done: make(chan struct{})}
	}
	c := v.next
	v.mu.Unlock()
	if owner {
		// The caller that opened the next check runs it: no goroutine per
		// check, and nothing left running when every caller has returned.
		<-c.start
		v.run(c, run)
		return c.err
	}
	<-c.done
	return c.err
}

// run runs check c, then hands over to the next check if one has callers.
func (v *Verifier) run(c *check, run func() error) {
	v.checks.Add(1)
	c.err = run()
	v.mu.Lock()
	next := v.next
	v.next = nil
	if next == nil {
		v.running = false
	}
	v.mu.Unlock()
	close(c.done)
	if next != nil {
		close(next.start) // running stays true: next is in flight now
	}
}

// Checks returns how many checks have started, for tests and metrics.
func (v *Verifier) Checks() uint64 { return v.checks.Load() }
