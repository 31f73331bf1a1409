package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/internal/cronjob"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// skewMargin is how long a period's completion mark outlives the period:
// a server whose clock is behind by less than this still finds the period
// done instead of running it again.
const skewMargin = 5 * time.Minute

// maxRetention is the server's limit on a completion mark's retention.
const maxRetention = 400 * 24 * time.Hour

// defaultCatchUp is --catch-up's default: a late start (a restart, a
// pause) still joins the period within the hour, a late deploy days later
// does not. It bounds only when a server begins to contend: a standby
// already waiting, and a failed run's retries, last until the period ends.
const defaultCatchUp = time.Hour

// CronCommand is `lockd cron [flags] SCHEDULE NAME -- CMD [ARGS...]`: every
// server of a fleet runs the same line, and for each period of the
// schedule exactly one of them runs CMD to success.
//
// Each period's attempt takes the exclusive lock NAME@START (START is the
// period's scheduled time in UTC, RFC 3339) and runs CMD under the same
// supervision as lockd run; an exit 0 completes the lock with a retention
// covering the rest of the period plus skewMargin, so the other servers
// (waiting in the lock's queue, or arriving later) get "already done". A
// failed run releases the lock: the next server in the queue runs it at
// once, and this one tries again after --retry-delay until the period
// ends (internal/cronjob has the policy).
type CronCommand struct {
	// Stderr receives help, errors and the log (slog text).
	Stderr io.Writer
	// Getenv reads the environment (LOCKD_ENDPOINTS, the test hook).
	Getenv func(string) string
}

// cronFlags are lockd cron's flags, after validation.
type cronFlags struct {
	run        runFlags // client, ttl, max-hold, kill-grace; name and command
	schedule   *cronjob.Schedule
	catchUp    time.Duration
	catchFirst bool // --catch-up-first: catch up even without a record of an earlier run
	retryDelay time.Duration
	offset     time.Duration
}

const cronUsage = "lockd cron [--endpoints URLS] [--tz ZONE] [--catch-up D] [--catch-up-first] [--retry-delay D] [--ttl D] [--max-hold D] [--kill-grace D] 'SCHEDULE' NAME -- CMD [ARGS...]"

const cronHelpHead = `Usage:

	lockd cron [flags] 'SCHEDULE' NAME -- CMD [ARGS...]

Run CMD once per period of SCHEDULE across a fleet: every server runs the
same line, and for each period exactly one of them runs CMD to success.
SCHEDULE is standard cron (minute hour day-of-month month day-of-week, or
@hourly, @daily, @weekly, @monthly, @yearly), in --tz (default UTC).

For the period starting at START, lockd cron takes lock NAME@START (START
in UTC, RFC 3339; CMD sees it in LOCKD_LOCK) and runs CMD like lockd run
(same supervision, LOCKD_TOKEN, LOCKD_SESSION). Exit 0 marks the period
done for every server. A failed run (non-zero exit, lease lost) leaves it
open: the next waiting server runs it at once, and this one tries again
after --retry-delay, until the period ends. A server joins a period (and
then waits for its lock until the period ends) when it reaches it inside
its window, the first --catch-up of the period (1h by default). One that
starts inside a window joins only if the fleet has a record of an earlier
run (the previous period done, or a server at work on it or on this one):
a first start never runs a period it did not see begin, unless
--catch-up-first. One that reaches a period after its window joins only
if a server holds or waits for the period's lock (it becomes a standby
for that run), and skips the period otherwise.
Runs in the foreground and logs to stderr; SIGINT, SIGTERM or SIGHUP stop
waiting, are forwarded to a running CMD, and lockd cron exits 0 once CMD
has ended. See docs/cron.md.

Flags:

`

const cronHelpTail = `
Exit status:

	0          stopped by a signal
	64         usage error
	1          any other error (the schedule has no more times)
`

// Run parses the arguments and runs the schedule until a signal.
func (c *CronCommand) Run(ctx context.Context, args []string) error {
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	f, err := c.parse(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(c.Stderr, nil))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A signal stops the scheduler (ending any wait for a lock) and is
	// forwarded to a running command, whose end the run waits for.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	jobSigs := make(chan os.Signal, 8)
	var stopping atomic.Bool
	go func() {
		for s := range sigs {
			if !stopping.Swap(true) {
				log.Info("stopping", "signal", signalName(s.(syscall.Signal)))
			}
			cancel()
			select {
			case jobSigs <- s:
			default:
			}
		}
	}()

	cl, err := f.run.client.client()
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())

	now := time.Now
	if f.offset != 0 {
		log.Warn("test hook: scheduler clock shifted", "env", clockOffsetEnv, "offset", f.offset)
		now = func() time.Time { return time.Now().Add(f.offset) }
	}
	j := &cronJob{f: f, cl: cl, log: log, now: now, stderr: c.Stderr, sigs: jobSigs, stopping: &stopping}
	log.Info("cron started", "schedule", f.schedule.String(), "tz", f.schedule.Location().String(), "name", f.run.name, "command", strings.Join(f.run.command, " "))
	cfg := cronjob.Config{
		Schedule:   f.schedule,
		CatchUp:    f.catchUp,
		RetryDelay: f.retryDelay,
		Now:        now,
		Logger:     log,
		Underway:   j.underway,
		Attempt:    j.attempt,
	}
	if !f.catchFirst {
		cfg.History = j.history
	}
	j.cfg = &cfg
	err = cronjob.Run(ctx, cfg)
	if err != nil {
		return exitWith(exitFailure, err)
	}
	log.Info("cron stopped")
	return nil
}

// cronJob runs the attempts of one lockd cron.
type cronJob struct {
	f        *cronFlags
	cl       *lockd.Client
	log      *slog.Logger
	now      func() time.Time
	stderr   io.Writer
	sigs     chan os.Signal
	stopping *atomic.Bool
	cfg      *cronjob.Config // the scheduler's, for the windows
}

// history reports whether the fleet ran the schedule at or just before
// period p: p's lock or the previous period's is marked done, held or
// waited for. The previous period's mark is kept through p's window (see
// retention), so a fleet restarted inside p's window finds it.
func (j *cronJob) history(ctx context.Context, p cronjob.Period) (bool, error) {
	names := []string{j.f.run.name + "@" + p.Key()}
	if prev, ok := j.f.schedule.At(p.Start.Add(-time.Second)); ok {
		names = append(names, j.f.run.name+"@"+prev.Key())
	}
	for _, name := range names {
		if busy, err := j.busy(ctx, name); err != nil || busy {
			return busy, err
		}
	}
	return false, nil
}

// underway reports whether the fleet is at work on period p after its
// window: p's lock held or waited for (a run began in time; this server
// becomes a standby for it) or marked done (the attempt then finds it
// done).
func (j *cronJob) underway(ctx context.Context, p cronjob.Period) (bool, error) {
	return j.busy(ctx, j.f.run.name+"@"+p.Key())
}

// busy reports whether lock name is marked done, held or waited for.
func (j *cronJob) busy(ctx context.Context, name string) (bool, error) {
	resp, err := j.cl.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
	if err != nil {
		return false, fmt.Errorf("describe %s: %w", name, err)
	}
	l := resp.Msg.GetLock()
	return l != nil && (l.GetMark() != nil || len(l.GetHolders()) > 0 || len(l.GetWaiters()) > 0), nil
}

// retention is how long the mark of period p, set now, is kept: the rest
// of p, then the longer of skewMargin and the next period's window, so a
// server that starts late in the next period finds the record history
// looks for.
func (j *cronJob) retention(p cronjob.Period) time.Duration {
	next := cronjob.Period{Start: p.End, End: j.f.schedule.Next(p.End)}
	after := skewMargin
	if !next.End.IsZero() {
		after = max(after, j.cfg.Window(next).Sub(next.Start))
	}
	return min(max(p.End.Sub(j.now())+after, time.Second), maxRetention)
}

// attempt waits (until ctx ends with the period) for the period's
// lock and, when granted, runs the command under lockd run's supervision.
func (j *cronJob) attempt(ctx context.Context, p cronjob.Period) cronjob.Outcome {
	name := j.f.run.name + "@" + p.Key()
	log := j.log.With("period", p.Key())
	dl := &deadlineRelay{changed: make(chan struct{}, 1)}
	sess, err := j.cl.NewSession(ctx, lockd.WithTTL(j.f.run.ttl), lockd.WithDeadlineFunc(dl.set))
	if err != nil {
		log.Warn("period not attempted: no session", "err", oneLine(err))
		return cronjob.Failed
	}
	m := sess.NewMutex(name)
	if err := m.Lock(ctx); err != nil {
		closeSession(sess, releaseTimeout)
		var done *lockd.DoneError
		switch {
		case errors.As(err, &done):
			log.Info("period already done", "by", done.Owner, "token", done.Token, "at", done.CompletedAt.UTC().Format(time.RFC3339Nano))
			return cronjob.Done
		case ctx.Err() != nil:
			return cronjob.Failed
		}
		log.Warn("period not attempted: lock not obtained", "lock", name, "err", oneLine(err))
		return cronjob.Failed
	}
	if j.stopping.Load() {
		// Granted just as a signal came: do not start the command.
		closeSession(sess, releaseTimeout)
		return cronjob.Failed
	}
	// The mark covers the rest of the period plus skewMargin (or the next
	// period's window), on this server's clock.
	retention := j.retention(p)
	rf := j.f.run
	rf.name, rf.once = name, retention
	log.Info("running job", "lock", name, "token", m.Token())
	start := time.Now()
	rc := &RunCommand{Stderr: j.stderr}
	err = rc.supervise(&rf, &lockdLease{sess: sess, lock: m, dl: dl}, j.sigs)
	took := time.Since(start).Round(time.Millisecond)
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = &exitError{code: exitFailure, err: err}
	}
	if ee.code == exitOK && rc.markErr != nil {
		// The job ran but the period is not marked (the lease ended, or
		// the cluster did not answer in time): another server may run
		// it again. This server does not: it did the work.
		log.Error("job succeeded but the period could not be marked done: another server may run it again", "took", took, "err", oneLine(rc.markErr))
		return cronjob.Done
	}
	if ee.code == exitOK {
		log.Info("job succeeded: period done", "took", took, "mark_kept", retention.Round(time.Second))
		return cronjob.Done
	}
	args := []any{"status", ee.code, "took", took}
	if ee.err != nil {
		args = append(args, "err", oneLine(ee.err))
	}
	log.Warn("job failed: period stays open", args...)
	return cronjob.Failed
}

// parse reads lockd cron's arguments. -h prints the help on c.Stderr.
func (c *CronCommand) parse(args []string) (_ *cronFlags, err error) {
	var f cronFlags
	fs := newFlagSet("cron", io.Discard)
	fs.Usage = func() {}
	defer func() {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(c.Stderr)
			fmt.Fprint(c.Stderr, cronHelpHead)
			fs.PrintDefaults()
			fmt.Fprint(c.Stderr, cronHelpTail)
		}
	}()
	f.run.client.register(fs, c.Getenv)
	tz := fs.String("tz", "UTC", "time zone of the schedule (IANA name, like Europe/Paris, or Local)")
	fs.DurationVar(&f.catchUp, "catch-up", defaultCatchUp, "begin to contend for a period at most this long after its scheduled time; a server that reaches it later joins only a run under way (its lock held or waited for) and skips it otherwise; a server already contending waits and retries until the period ends (0: the whole period)")
	fs.BoolVar(&f.catchFirst, "catch-up-first", false, "catch up a period that began before this server started even when the fleet has no record of an earlier run (a first deploy)")
	fs.DurationVar(&f.retryDelay, "retry-delay", 10*time.Second, "after a failed run here, try the same period again after this long, until the period ends")
	fs.DurationVar(&f.run.ttl, "ttl", lockd.DefaultTTL, "session lease TTL (1s to 1h)")
	fs.DurationVar(&f.run.maxHold, "max-hold", 0, "end the command after this long: SIGTERM, then SIGKILL after --kill-grace (0: no limit)")
	killGrace := fs.String("kill-grace", "", "time between SIGTERM and SIGKILL, and how long before the lease deadline SIGTERM is sent (default min(2s, TTL/4))")

	// Everything after the first "--" is the command.
	flagArgs, command := args, []string(nil)
	for i, a := range args {
		if a == "--" {
			flagArgs, command = args[:i], args[i+1:]
			break
		}
	}
	pos, err := parseArgs(fs, flagArgs)
	if err != nil {
		return nil, err
	}
	if len(pos) != 2 || len(command) == 0 {
		return nil, usageError{fmt.Errorf("usage: %s", cronUsage)}
	}
	loc, err := time.LoadLocation(*tz)
	if err != nil {
		return nil, usageError{fmt.Errorf("--tz %q: %w", *tz, err)}
	}
	if f.schedule, err = cronjob.Parse(pos[0], loc); err != nil {
		return nil, usageError{err}
	}
	f.run.name, f.run.command = pos[1], command
	if f.run.name == "" || strings.Contains(f.run.name, "@") {
		return nil, usageError{fmt.Errorf("NAME %q: want a non-empty name without '@' (the period is added after one)", f.run.name)}
	}
	switch {
	case f.catchUp < 0:
		return nil, usageError{fmt.Errorf("--catch-up %v must not be negative", f.catchUp)}
	case f.retryDelay <= 0:
		return nil, usageError{fmt.Errorf("--retry-delay %v must be positive", f.retryDelay)}
	case f.run.ttl <= 0:
		return nil, usageError{fmt.Errorf("--ttl %v must be positive", f.run.ttl)}
	case f.run.maxHold < 0:
		return nil, usageError{fmt.Errorf("--max-hold %v must not be negative", f.run.maxHold)}
	}
	f.run.killGrace, f.run.killGraceSet = defaultKillGrace(f.run.ttl), *killGrace != ""
	if f.run.killGraceSet {
		d, err := time.ParseDuration(*killGrace)
		if err != nil || d < 0 || d > f.run.ttl/2 {
			return nil, usageError{fmt.Errorf("--kill-grace %q: want a duration from 0 to half the TTL", *killGrace)}
		}
		f.run.killGrace = d
	}
	if v := c.Getenv(clockOffsetEnv); clockOffsetEnv != "" && v != "" {
		if f.offset, err = time.ParseDuration(v); err != nil {
			return nil, usageError{fmt.Errorf("%s %q: %w", clockOffsetEnv, v, err)}
		}
	}
	return &f, nil
}
