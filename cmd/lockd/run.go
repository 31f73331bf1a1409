package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/supervise"
)

// Environment variables lockd run gives the command.
const (
	envLock    = "LOCKD_LOCK"
	envToken   = "LOCKD_TOKEN"
	envSession = "LOCKD_SESSION"
	envTokens  = "LOCKD_TOKENS" // --lock sets: NAME=TOKEN,… in --lock order
)

// releaseTimeout bounds the release after the command ended normally.
const releaseTimeout = 10 * time.Second

// RunCommand is `lockd run NAME -- CMD [ARGS...]`: run CMD while holding
// lock NAME.
//
// The command runs in its own process group led by a supervisor (the lockd
// binary re-executed, see internal/supervise) that ends the group before the
// session's lease can be lost on the server, even when lockd run itself is
// killed or frozen. The lock is released once the group is empty.
type RunCommand struct {
	// Stderr receives help, warnings and messages; nil means os.Stderr.
	// The command itself writes to lockd's own stdout and stderr files.
	Stderr io.Writer
	// Getenv reads the environment (LOCKD_ENDPOINTS).
	Getenv func(string) string

	elect bool // lockd elect: campaign with a value (elect.go)
	// markErr is why --once's completion mark could not be set after the
	// command succeeded (lockd cron reads it), or nil.
	markErr error
}

// heldLock is the lock taken, whichever its kind.
type heldLock interface {
	Token() uint64
	Done() <-chan struct{}
	// Deadline is the earlier of the lease's and the hold budget's end.
	Deadline() time.Time
}

// Run acquires the lock, runs the command under a supervisor, releases the
// lock when the command's group is empty and returns an *exitError with the
// documented status.
func (c *RunCommand) Run(ctx context.Context, args []string) error {
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	f, err := c.parse(args)
	if err != nil {
		return err
	}

	// SIGINT, SIGTERM and SIGHUP: while waiting, stop waiting; while the
	// command runs, forward them to its group.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	// The acquisition: session and lock, bounded by --wait, ended by a signal.
	actx, cancelAcquire := context.WithCancelCause(ctx)
	defer cancelAcquire(nil)
	if f.waitSet && f.wait > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(actx, f.wait)
		defer cancel()
	}
	acquired := make(chan struct{})
	watcher := make(chan syscall.Signal, 1) // the signal that ended the wait, or 0
	go func() {
		select {
		case s := <-sigs:
			cancelAcquire(errInterrupted)
			watcher <- s.(syscall.Signal)
		case <-acquired:
			watcher <- 0
		}
	}()

	acquire := c.acquireLockd
	if len(f.redis) > 0 {
		acquire = c.acquireRedis
	}
	l, closeBackend, err := acquire(actx, f)
	if closeBackend != nil {
		defer closeBackend()
	}
	close(acquired)
	if sig := <-watcher; sig != 0 {
		// Interrupted while waiting (or just as the grant came): the
		// command does not start.
		if l != nil {
			c.release(l, releaseTimeout)
		}
		return exitWith(128+int(sig), fmt.Errorf("interrupted by %s while waiting for lock %q", signalName(sig), f.name))
	}
	if err != nil {
		if ue := (usageError{}); errors.As(err, &ue) {
			return err
		}
		return c.acquireError(f, err)
	}
	return c.supervise(f, l, sigs)
}

// acquireLockd takes the lock on lockd, in a session of its own. On error
// nothing is left held. The returned func closes the client.
func (c *RunCommand) acquireLockd(ctx context.Context, f *runFlags) (lease, func(), error) {
	cl, err := f.client.client()
	if err != nil {
		return nil, nil, err
	}
	closeClient := func() { cl.Close(context.Background()) }
	dl := &deadlineRelay{changed: make(chan struct{}, 1)}
	sess, err := cl.NewSession(ctx, lockd.WithTTL(f.ttl), lockd.WithDeadlineFunc(dl.set))
	if err != nil {
		return nil, closeClient, err
	}
	lock, err := c.acquire(ctx, sess, f)
	if err != nil {
		c.closeSession(sess, releaseTimeout)
		return nil, closeClient, err
	}
	return &lockdLease{sess: sess, lock: lock, dl: dl}, closeClient, nil
}

var errInterrupted = errors.New("interrupted")

// acquire takes the lock in the mode the flags ask. A blocking Lock waits
// on through a cluster that does not answer for a while (a node froze or
// died under the wait, no leader) as long as the session lives, with the
// same request, so it keeps its place in the queue; a lost session ends
// it (exit 69).
func (c *RunCommand) acquire(ctx context.Context, sess *lockd.Session, f *runFlags) (heldLock, error) {
	try := f.waitSet && f.wait == 0
	// --max-hold of a second or more is also the hold's budget on the
	// server: a stuck run loses the lock even while this process keeps its
	// session alive. Shorter ones stay the supervisor's alone.
	var budget lockd.LockOption
	if f.maxHold >= time.Second {
		budget = lockd.WithMaxHold(f.maxHold)
	}
	switch {
	case len(f.locks) > 0:
		l := sess.NewMultiLock(f.locks, budget)
		if try {
			return multiHeld{l}, l.TryLock(ctx)
		}
		return multiHeld{l}, l.Lock(ctx)
	case f.limitSet:
		l := sess.NewSemaphore(f.name, uint32(f.limit), lockd.WithLockDelay(f.lockDelay), budget)
		if try {
			return l, l.TryLock(ctx)
		}
		return l, l.Lock(ctx)
	case f.shared:
		l := sess.NewRWMutex(f.name, lockd.WithLockDelay(f.lockDelay), budget)
		if try {
			return l, l.TryRLock(ctx)
		}
		return l, l.RLock(ctx)
	default:
		// An election's leader is the holder of its exclusive lock, its
		// value what the leader announces (lockd elect, Election.Campaign).
		l := sess.NewMutex(f.name, lockd.WithLockDelay(f.lockDelay), lockd.WithValue(f.value), budget)
		if try {
			return l, l.TryLock(ctx)
		}
		return l, l.Lock(ctx)
	}
}

// acquireError maps a failed acquisition to an exit status.
func (c *RunCommand) acquireError(f *runFlags, err error) error {
	var busy *lockd.BusyError
	switch {
	case errors.As(err, &busy):
		return exitWith(f.conflictExitCode, busyError(busy))
	case errors.Is(err, lockd.ErrBusy):
		// The Redis backends say busy without a holder.
		return exitWith(f.conflictExitCode, fmt.Errorf("lock %q is busy", f.name))
	case errors.Is(err, lockd.ErrAlreadyDone) && f.once > 0:
		// --once: someone already did the job; nothing to do is success.
		fmt.Fprintf(c.Stderr, "lockd: %s; not running %s\n", oneLine(err), f.command[0])
		return exitWith(exitOK, nil)
	case errors.Is(err, lockd.ErrAlreadyDone):
		// Without --once a done lock is simply not obtained.
		return exitWith(f.conflictExitCode, fmt.Errorf("lock %q not obtained: %w", f.name, err))
	case errors.Is(err, lockd.ErrUnavailable):
		return exitWith(exitUnavailable, fmt.Errorf("lock %q not obtained: no server reachable or no leader: %w", f.name, err))
	case errors.Is(err, context.DeadlineExceeded):
		return exitWith(f.conflictExitCode, fmt.Errorf("lock %q not obtained within --wait %v", f.name, f.wait))
	case errors.Is(err, lockd.ErrInvalidArgument), errors.Is(err, lockd.ErrLimitMismatch), errors.Is(err, lockd.ErrAlreadyHeld), errors.Is(err, errors.ErrUnsupported):
		return exitWith(exitUsage, fmt.Errorf("lock %q refused: %w", f.name, err))
	case errors.Is(err, lockd.ErrLeaseLost):
		// The session could not be kept alive while waiting: the cluster
		// was out of reach for longer than the TTL.
		return exitWith(exitUnavailable, fmt.Errorf("lock %q not obtained: session lost while waiting: %w", f.name, err))
	}
	return exitWith(exitFailure, fmt.Errorf("lock %q not obtained: %w", f.name, err))
}

// supervise runs the command while the lock is held and releases the lock
// when its group is empty.
func (c *RunCommand) supervise(f *runFlags, l lease, sigs <-chan os.Signal) error {
	if !f.killGraceSet {
		// The server may grant another TTL than the one asked.
		f.killGrace = defaultKillGrace(l.ttl())
	}
	// The token as granted: a lost Redis hold reports 0 afterwards.
	token := l.token()
	set := map[string]string{envLock: f.name}
	if token != 0 {
		set[envToken] = strconv.FormatUint(token, 10)
	}
	if id := l.sessionID(); id != "" {
		set[envSession] = id
	}
	if ts := tokensEnv(l, f.locks); ts != "" {
		set[envTokens] = ts
	}
	env := withEnv(os.Environ(), set)
	deadline := l.deadline()
	if err := l.err(); err != nil {
		// Lost between the grant and now: never start the command.
		c.release(l, releaseTimeout)
		return exitWith(exitStopped, fmt.Errorf("lock %q lost before %s started: %w", f.name, f.command[0], err))
	}
	proc, err := supervise.Start(supervise.Config{
		Command:   f.command,
		Env:       env,
		Stdin:     os.Stdin,
		Stdout:    os.Stdout,
		Stderr:    os.Stderr,
		Deadline:  deadline,
		KillGrace: f.killGrace,
		MaxHold:   f.maxHold,
	})
	if err != nil {
		c.release(l, releaseTimeout)
		return exitWith(exitFailure, fmt.Errorf("run %s: %w", f.command[0], err))
	}

	// Renew the supervisor's deadline from the lease's keepalives. The
	// lockd session signals them on its keepalive goroutine, which must
	// not block on the pipe.
	stopRelay := make(chan struct{})
	var relay sync.WaitGroup
	relay.Go(func() {
		for {
			select {
			case <-l.changed():
				_ = proc.SetDeadline(l.deadline())
			case <-stopRelay:
				return
			}
		}
	})
	defer func() { close(stopRelay); relay.Wait() }()
	if d := l.deadline(); !d.IsZero() && !d.Equal(deadline) {
		_ = proc.SetDeadline(d)
	}

	lost, revoke := l.lost(), releaseRequests(l)
	stoppedForLoss, termSent := false, false
	for waiting := true; waiting; {
		select {
		case <-proc.Done():
			waiting = false
		case <-lost:
			// The hold is gone: someone else may hold the lock now.
			_ = proc.Stop(l.lostReason())
			proc.Kill()
			lost, stoppedForLoss = nil, true
		case s := <-sigs:
			_ = proc.Signal(s.(syscall.Signal))
		case r := <-revoke:
			termSent = c.releaseRequested(f, proc, r, termSent) // run_revoke.go
		}
	}
	res, err := proc.Wait()
	if err != nil {
		// The supervisor died and Wait killed and reaped the group itself.
		c.release(l, releaseTimeout)
		return exitWith(exitStopped, fmt.Errorf("stopped %s (lock %q, token %d): %w", f.command[0], f.name, token, err))
	}
	if stoppedForLoss && res.Killed == supervise.ReasonNone {
		// The direct SIGKILL can end the command before the supervisor
		// reads the stop message, which then reports a plain SIGKILL: it
		// was still this lockd run that stopped it, for the lost lease.
		res.Killed = supervise.Reason(l.lostReason())
	}
	switch {
	case res.Killed != supervise.ReasonNone:
		// Before the release below ends the session.
		reason := killReason(res.Killed, f)
		if res.Killed == supervise.ReasonDeadline && f.maxHold >= time.Second && budgetFirst(l) {
			reason = fmt.Sprintf("the hold's budget (--max-hold %v, on the server too) runs out: stopped %v before it", f.maxHold, f.killGrace)
		}
		if res.Killed == supervise.ReasonDeadline {
			// The lease is in jeopardy, most likely lost: release if the
			// server answers quickly, without outliving the deadline, and
			// without a warning when it does not.
			left := time.Until(l.deadline())
			_ = l.release(min(left/2, left-100*time.Millisecond))
		} else {
			c.release(l, releaseTimeout)
		}
		return exitWith(exitStopped, fmt.Errorf("stopped %s (lock %q, token %d): %s", f.command[0], f.name, token, reason))
	case res.ExecError != "":
		c.release(l, releaseTimeout)
		return exitWith(res.ExitCode, errors.New(res.ExecError))
	}
	if f.once > 0 && res.Status() == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		err := l.complete(ctx, f.once)
		cancel()
		if err != nil {
			// The job ran; only the mark is missing: a later run may repeat
			// it. Say so, but the command's status stands.
			fmt.Fprintf(c.Stderr, "lockd: warning: could not mark %q done: %s\n", f.name, oneLine(err))
			c.markErr = err
		}
	}
	c.release(l, releaseTimeout)
	return exitWith(res.Status(), nil)
}

// release gives the hold up, trying for at most timeout (at least once).
// A failure is reported but changes nothing else: the server frees the
// lock when the lease runs out.
func (c *RunCommand) release(l lease, timeout time.Duration) {
	if err := l.release(timeout); err != nil {
		fmt.Fprintf(c.Stderr, "lockd: warning: release: %s (the server frees the lock when the lease's TTL runs out)\n", oneLine(err))
	}
}

// closeSession ends the session, which releases the lock, trying for at
// most timeout (at least once). A failure is reported but changes nothing
// else: the server frees the lock when the session expires.
func (c *RunCommand) closeSession(sess *lockd.Session, timeout time.Duration) {
	if err := closeSession(sess, timeout); err != nil {
		fmt.Fprintf(c.Stderr, "lockd: warning: release: %s (the server frees the lock when the session's TTL runs out)\n", oneLine(err))
	}
}

func closeSession(sess *lockd.Session, timeout time.Duration) error {
	// Even with no time left, Close marks the session closed, so the
	// client's own Close does not try again.
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, 0))
	defer cancel()
	return sess.Close(ctx)
}

// deadlineRelay hands the session's lease deadline from the keepalive
// goroutine to the supervisor without blocking the former.
type deadlineRelay struct {
	mu      sync.Mutex
	t       time.Time
	changed chan struct{}
}

func (d *deadlineRelay) set(t time.Time) {
	d.mu.Lock()
	d.t = t
	d.mu.Unlock()
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

func (d *deadlineRelay) get() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.t
}

// withEnv returns env with the given variables set. lockd run's own
// variables are always removed first, so a command never sees a stale
// LOCKD_TOKEN from an outer lockd run when this backend issues none.
func withEnv(env []string, set map[string]string) []string {
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		_, ok := set[k]
		if !ok && k != envLock && k != envToken && k != envSession && k != envTokens {
			out = append(out, kv)
		}
	}
	for _, k := range []string{envLock, envToken, envSession, envTokens} {
		if v, ok := set[k]; ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
}

// busyError says who holds the lock.
func busyError(b *lockd.BusyError) error {
	var holders []string
	for _, h := range b.Holders {
		holders = append(holders, fmt.Sprintf("session %s (%s, token %d)", h.SessionID, h.Owner, h.Token))
	}
	if len(holders) == 0 {
		return fmt.Errorf("lock %q is busy: other requests wait for it", b.Name)
	}
	return fmt.Errorf("lock %q is busy: held by %s", b.Name, strings.Join(holders, ", "))
}

// killReason explains why the supervisor stopped the command.
func killReason(r supervise.Reason, f *runFlags) string {
	switch r {
	case supervise.ReasonDeadline:
		return fmt.Sprintf("lease in jeopardy: no keepalive confirmed in time, stopped %v before the lease deadline", f.killGrace)
	case supervise.ReasonMaxHold:
		return fmt.Sprintf("--max-hold %v ran out", f.maxHold)
	}
	return string(r)
}

// budgetFirst reports whether l's deadline is its hold budget's rather than
// its lease's (lockd only: a Redis hold has no budget on the server).
func budgetFirst(l lease) bool {
	ll, ok := l.(*lockdLease)
	if !ok {
		return false
	}
	d := ll.dl.get()
	if d.IsZero() {
		d = ll.sess.Deadline()
	}
	return ll.deadline().Before(d)
}

// multiHeld is a --lock set as a heldLock: its token is its first lock's
// (LOCKD_TOKEN, messages); LOCKD_TOKENS has them all.
type multiHeld struct{ *lockd.MultiLock }

func (m multiHeld) Token() uint64 { return m.Tokens()[m.Names()[0]] }

// tokensEnv renders a --lock set's tokens as NAME=TOKEN,… in names' order,
// "" when l holds no set.
func tokensEnv(l lease, names []string) string {
	ll, ok := l.(*lockdLease)
	if !ok {
		return ""
	}
	m, ok := ll.lock.(multiHeld)
	if !ok {
		return ""
	}
	toks := m.Tokens()
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + strconv.FormatUint(toks[n], 10)
	}
	return strings.Join(parts, ",")
}
