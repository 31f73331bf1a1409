// Package loadgen runs the lock workloads of `lockd bench` against any lock
// service behind a Driver: lockd itself in cmd/lockd, and Redis, etcd and
// ZooKeeper in the comparison harness under bench/ (its own module, which
// may import this package because internal/ is judged by import path).
// Sharing the engine is what makes the numbers comparable: every system
// runs the same loops, is timed by the same clock and histogram, and is
// reported in the same Report.
//
// Every worker has its own Client and Session, the way users run copies of
// an application. Every loop ends at the run's end and after MaxOps
// operations, whichever comes first.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Workload names, as given to `lockd bench --workload`.
const (
	// Own: each worker takes and releases its own lock, over and over; an
	// op is one acquire+release pair, its latency the pair's.
	Own = "own"
	// One: every worker takes and releases one shared lock; an op is one
	// grant (a handoff when others wait), its latency the acquire's wait.
	One = "one"
	// Handoff: every worker contends on one lock; an op is a grant to a
	// worker that was already waiting, its latency the time from the
	// previous holder's release call to that grant.
	Handoff = "handoff"
	// Sessions: Config.Sessions sessions are created across the clients
	// and kept alive until the end; an op is one session created.
	Sessions = "sessions"
)

// Workloads lists the workload names in the order the help text gives them.
var Workloads = []string{Own, One, Handoff, Sessions}

// Driver opens clients of one lock service.
type Driver interface {
	// System names the service in reports: "lockd", "redis", "etcd",
	// "zookeeper".
	System() string
	// NewClient opens a client with connections of its own.
	NewClient(ctx context.Context) (Client, error)
	// ErrorKind names the kind of err for the report's error counts
	// ("unavailable", "timeout", "lease-lost", ...).
	ErrorKind(err error) string
	// ConnsOpened returns the connections dialled so far by all the
	// driver's clients, or -1 when the driver cannot count them.
	ConnsOpened() int64
}

// Client is one worker's connection to the service.
type Client interface {
	// NewSession opens a lease of about ttl that the client keeps alive.
	NewSession(ctx context.Context, ttl time.Duration) (Session, error)
	// Close closes the client and its sessions.
	Close(ctx context.Context) error
}

// Session is a lease that locks live and die with.
type Session interface {
	// NewMutex returns an exclusive lock on name held by this session.
	NewMutex(name string) Mutex
	// Done is closed when the lease is lost (nil when the service has no
	// session leases, like Redis).
	Done() <-chan struct{}
	// Close ends the session, releasing what it holds.
	Close(ctx context.Context) error
}

// Mutex is an exclusive lock.
type Mutex interface {
	// Lock blocks until the lock is held or ctx ends.
	Lock(ctx context.Context) error
	// Unlock releases the lock.
	Unlock(ctx context.Context) error
}

// Config is one run. Durations have no unit conversions: they are used as
// given.
type Config struct {
	// Workload is one of Own, One, Handoff, Sessions.
	Workload string
	// Clients is the number of workers, each with its own Client and
	// Session (for Sessions: the clients the sessions are spread over).
	Clients int
	// Duration is the measured window, after Warmup.
	Duration time.Duration
	// Warmup runs the workload unmeasured before the window, so that
	// connections, caches and the server's queues are in a steady state.
	Warmup time.Duration
	// TTL is every session's lease TTL.
	TTL time.Duration
	// Sessions is the number of sessions the Sessions workload creates.
	Sessions int
	// MaxOps bounds each worker's operations (errors included) over the
	// whole run, warm-up included.
	MaxOps int64
	// OpTimeout bounds one call (acquire, release, session creation).
	OpTimeout time.Duration
	// Prefix starts every lock name, so that runs do not share locks.
	Prefix string
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Workload != Own && c.Workload != One && c.Workload != Handoff && c.Workload != Sessions:
		return fmt.Errorf("unknown workload %q (want %s, %s, %s or %s)", c.Workload, Own, One, Handoff, Sessions)
	case c.Clients < 1:
		return fmt.Errorf("clients %d: want at least 1", c.Clients)
	case (c.Workload == One || c.Workload == Handoff) && c.Clients < 2:
		return fmt.Errorf("workload %s needs at least 2 clients to hand the lock over", c.Workload)
	case c.Duration <= 0:
		return fmt.Errorf("duration %v: want a positive duration", c.Duration)
	case c.Warmup < 0:
		return fmt.Errorf("warmup %v: want zero or more", c.Warmup)
	case c.TTL <= 0:
		return fmt.Errorf("ttl %v: want a positive duration", c.TTL)
	case c.Workload == Sessions && c.Sessions < 1:
		return fmt.Errorf("sessions %d: want at least 1", c.Sessions)
	case c.MaxOps < 1:
		return fmt.Errorf("max ops %d: want at least 1", c.MaxOps)
	case c.OpTimeout <= 0:
		return fmt.Errorf("op timeout %v: want a positive duration", c.OpTimeout)
	}
	return nil
}

// cleanupTimeout bounds closing the clients after the run.
const cleanupTimeout = 30 * time.Second

// Run runs cfg against d and returns its report. Opening the workers'
// clients and sessions happens before the clock starts; failing to open
// one ends the run with an error (the Sessions workload counts creation
// errors instead). Cancelling ctx ends the run early with ctx's error.
func Run(ctx context.Context, d Driver, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conns0 := d.ConnsOpened()
	if cfg.Workload == Sessions {
		return runSessions(ctx, d, cfg, conns0)
	}
	workers, err := openWorkers(ctx, d, cfg)
	defer closeWorkers(workers)
	if err != nil {
		return nil, err
	}
	var loop func(ctx context.Context, w *worker)
	shared := &handoffState{}
	shared.cond = sync.NewCond(&shared.mu)
	switch cfg.Workload {
	case Own:
		loop = func(ctx context.Context, w *worker) { w.own(ctx, fmt.Sprintf("%s/own/%d", cfg.Prefix, w.id)) }
	case One:
		loop = func(ctx context.Context, w *worker) { w.one(ctx, cfg.Prefix+"/one") }
	case Handoff:
		loop = func(ctx context.Context, w *worker) { w.handoff(ctx, cfg.Prefix+"/handoff", shared) }
	}
	win := newWindow(cfg)
	runCtx, cancel := context.WithDeadline(ctx, win.to)
	defer cancel()
	stop := context.AfterFunc(runCtx, shared.wake)
	defer stop()
	var wg sync.WaitGroup
	for _, w := range workers {
		w.rec = newRecorder(win)
		wg.Go(func() { loop(runCtx, w) })
	}
	m := win.measure(runCtx, d, &wg)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	recs := make([]*recorder, len(workers))
	for i, w := range workers {
		recs[i] = w.rec
	}
	r := newReport(d, cfg, recs, m, conns0)
	return r, nil
}

// worker is one client and session running a workload loop.
type worker struct {
	id   int
	cfg  Config
	d    Driver
	cl   Client
	sess Session
	rec  *recorder
}

// openWorkers opens every worker's client and session concurrently. On
// error it returns what it opened, for closeWorkers.
func openWorkers(ctx context.Context, d Driver, cfg Config) ([]*worker, error) {
	workers := make([]*worker, cfg.Clients)
	errs := make([]error, cfg.Clients)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			octx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
			defer cancel()
			cl, err := d.NewClient(octx)
			if err != nil {
				errs[i] = fmt.Errorf("open client %d: %w", i, err)
				return
			}
			w := &worker{id: i, cfg: cfg, d: d, cl: cl}
			workers[i] = w
			if w.sess, err = cl.NewSession(octx, cfg.TTL); err != nil {
				errs[i] = fmt.Errorf("open session %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	var opened []*worker
	for _, w := range workers {
		if w != nil {
			opened = append(opened, w)
		}
	}
	return opened, errors.Join(errs...)
}

// closeWorkers closes every worker's client (and so its session), all at
// once, bounded by cleanupTimeout.
func closeWorkers(workers []*worker) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { _ = w.cl.Close(ctx) })
	}
	wg.Wait()
}

// call runs f with a fresh context bounded by OpTimeout under parent.
func (w *worker) call(parent context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(parent, w.cfg.OpTimeout)
	defer cancel()
	return f(ctx)
}

// failed records err unless the run's end caused it, and reports whether
// the loop should go on.
func (w *worker) failed(run context.Context, err error) bool {
	if run.Err() != nil {
		return false
	}
	w.rec.fail(w.d.ErrorKind(err), err)
	return true
}

// unlock releases m with its own context: a lock taken just before the
// run's end is still released, so the next run starts clean.
func (w *worker) unlock(run context.Context, m Mutex) error {
	err := w.call(context.WithoutCancel(run), m.Unlock)
	if err != nil && run.Err() == nil {
		w.rec.fail(w.d.ErrorKind(err), err)
	}
	return err
}

// own is the Own loop: acquire+release pairs on the worker's own lock.
func (w *worker) own(run context.Context, name string) {
	m := w.sess.NewMutex(name)
	for n := int64(0); n < w.cfg.MaxOps && run.Err() == nil; n++ {
		start := time.Now()
		if err := w.call(run, m.Lock); err != nil {
			if !w.failed(run, err) {
				return
			}
			continue
		}
		if w.unlock(run, m) == nil {
			w.rec.op(start, time.Now())
		}
	}
}

// one is the One loop: acquire (waiting in the queue), release at once.
func (w *worker) one(run context.Context, name string) {
	m := w.sess.NewMutex(name)
	for n := int64(0); n < w.cfg.MaxOps && run.Err() == nil; n++ {
		start := time.Now()
		if err := w.call(run, m.Lock); err != nil {
			if !w.failed(run, err) {
				return
			}
			continue
		}
		granted := time.Now()
		if w.unlock(run, m) == nil {
			w.rec.op(start, granted)
		}
	}
}

// handoffHold is how long a holder in the Handoff workload keeps the lock
// once another worker has called Lock: long enough for that request to
// reach the server's queue on loopback, so that the measured grants are
// wake-ups of queued waiters rather than acquires of a free lock.
const handoffHold = time.Millisecond

// handoffState is what the Handoff workers share: when the last release
// started (monotonic, as time since the run's base) and how many workers
// are inside Lock.
type handoffState struct {
	mu       sync.Mutex
	cond     *sync.Cond
	waiting  int
	released time.Time // start of the last release call; zero before the first
}

func (h *handoffState) wake() {
	h.mu.Lock()
	h.cond.Broadcast()
	h.mu.Unlock()
}

// handoff is the Handoff loop. A grant counts when this worker called Lock
// before the previous holder started its release, so the latency is the
// handoff itself, not an acquire of a free lock.
func (w *worker) handoff(run context.Context, name string, h *handoffState) {
	m := w.sess.NewMutex(name)
	for n := int64(0); n < w.cfg.MaxOps && run.Err() == nil; n++ {
		h.mu.Lock()
		h.waiting++
		h.cond.Broadcast()
		h.mu.Unlock()
		start := time.Now()
		err := w.call(run, m.Lock)
		granted := time.Now()
		h.mu.Lock()
		h.waiting--
		released := h.released
		// Wait for a waiter, so that the release below is a handoff.
		for err == nil && h.waiting == 0 && run.Err() == nil {
			h.cond.Wait()
		}
		h.mu.Unlock()
		if err != nil {
			if !w.failed(run, err) {
				return
			}
			continue
		}
		if !released.IsZero() && start.Before(released) {
			w.rec.op(released, granted)
		}
		if run.Err() == nil {
			time.Sleep(handoffHold)
		}
		h.mu.Lock()
		h.released = time.Now()
		h.mu.Unlock()
		_ = w.unlock(run, m)
	}
}
