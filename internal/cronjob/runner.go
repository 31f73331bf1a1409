package cronjob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Outcome is what one attempt at a period's job came to.
type Outcome int

const (
	// Done: the period's job is done, by this server or by another (its
	// completion mark was seen). The period is not tried again here.
	Done Outcome = iota
	// Failed: the job failed here (non-zero exit, lease lost) or could not
	// be started (no server reachable). The period stays open: this server
	// tries again after the retry delay until the period ends, and the
	// other servers waiting for the period's lock try it at once.
	Failed
)

// maxSleep bounds every wait for the next period, so a stepped wall
// clock (NTP, a VM resumed) is noticed within a minute.
const maxSleep = time.Minute

// Config is what Run needs.
type Config struct {
	// Schedule gives the periods.
	Schedule *Schedule
	// CatchUp bounds how late a server may begin to contend for a period:
	// one that reaches the period more than CatchUp after its scheduled
	// time (it started late, woke from a pause, or its clock is behind)
	// joins it only if the fleet is at work on it (see Underway). A server
	// that began to contend in time keeps contending until the period
	// ends, whatever CatchUp: it is the standby that takes over when the
	// runner dies. 0 means the whole period.
	CatchUp time.Duration
	// RetryDelay is how long this server waits after a failed attempt
	// before it tries the same period again, until the period ends.
	RetryDelay time.Duration
	// Now reads the scheduler's clock; nil means time.Now. A test shifts it
	// to play a server whose clock is off.
	Now func() time.Time
	// History reports whether the fleet has a record of running the
	// schedule at or just before period p: the period before p done (its
	// completion mark), or a server at work on p or on the period before.
	// Run asks it before catching up, inside its window, a period that
	// began before Run started, and skips the period without such a
	// record: the first start of a fleet (a first deploy on the 20th of
	// the month, say) must not run a period it did not see begin. nil
	// catches up without asking. An error is asked again after RetryDelay.
	History func(ctx context.Context, p Period) (bool, error)
	// Underway reports whether the fleet is at work on period p (a server
	// holds or waits for its lock) or has done it. Run asks it when it
	// reaches p after p's window without contending for p yet, and joins
	// p (contends until its end) only if so: a server restarted while
	// another runs the period is a standby again, but nobody starts a
	// period late that no server started in time. nil skips every period
	// reached after its window. An error is asked again after RetryDelay.
	Underway func(ctx context.Context, p Period) (bool, error)
	// Logger receives one line per period decision; nil discards.
	Logger *slog.Logger
	// Attempt tries to run the job of period p. Its ctx ends when p ends
	// on the scheduler's clock (the wait for the lock must not outlast it)
	// or when Run's ctx ends; a job already running is not bound by ctx.
	Attempt func(ctx context.Context, p Period) Outcome
}

// Window returns when a server may no longer begin to contend for a
// period (unless the fleet is at work on it): its end, or CatchUp after
// its start when that comes first.
func (c *Config) Window(p Period) time.Time {
	if c.CatchUp > 0 && p.Start.Add(c.CatchUp).Before(p.End) {
		return p.Start.Add(c.CatchUp)
	}
	return p.End
}

// Run calls Attempt for every period of the schedule, from the one that
// contains now, until ctx ends; then it returns nil. It returns an error
// only when the schedule has no more times.
//
// A server joins a period [Start, End) (begins to contend for it) when
// its clock first shows a time inside the period:
//   - inside the window [Start, Window): at once; for a period that began
//     before Run started, only if History finds an earlier run (a first
//     start skips it);
//   - after the window: only if Underway finds the fleet at work on it,
//     else the period is skipped.
//
// Once joined, the server contends until the period ends: an attempt
// waits for the lock until End, and a failed attempt is repeated after
// RetryDelay while one can still start before End. Attempts run one at a
// time: while a job runs, no other period starts on this server.
func Run(ctx context.Context, cfg Config) error {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	started := now()
	var handled time.Time // start of the last period done, skipped or given up here
	var joined time.Time  // start of the last period this server contends for
	for ctx.Err() == nil {
		t := now()
		p, ok := cfg.Schedule.At(t)
		if ok && p.Start.After(handled) {
			if !joined.Equal(p.Start) {
				switch join(ctx, &cfg, log, p, t, started) {
				case skip:
					handled = p.Start
					continue
				case askAgain:
					if now().Add(cfg.RetryDelay).Before(p.End) {
						sleep(ctx, cfg.RetryDelay)
					} else {
						log.Warn("period given up here: it ends before its record can be asked again", "period", p.Key())
						handled = p.Start
					}
					continue
				}
				joined = p.Start
			}
			// The wait for the lock lasts until the period ends, not
			// the window: a standby must outlast a runner that dies late.
			actx, cancel := context.WithTimeout(ctx, p.End.Sub(now()))
			out := cfg.Attempt(actx, p)
			cancel()
			if ctx.Err() != nil {
				break
			}
			if out == Done {
				handled = p.Start
				continue
			}
			if now().Add(cfg.RetryDelay).Before(p.End) {
				log.Info("period still open: trying again", "period", p.Key(), "after", cfg.RetryDelay)
				sleep(ctx, cfg.RetryDelay)
				continue
			}
			log.Warn("period given up here: it ends before another attempt", "period", p.Key(), "end", p.End.UTC().Format(time.RFC3339))
			handled = p.Start
			continue
		}
		next := p.Start
		if ok {
			next = cfg.Schedule.Next(t)
		}
		if next.IsZero() {
			return fmt.Errorf("schedule %q: %w", cfg.Schedule, errNoNext)
		}
		sleep(ctx, min(next.Sub(t), maxSleep))
	}
	return nil
}

// decision is whether a server joins a period it reached at t.
type decision int

const (
	enter    decision = iota // contend for the period until it ends
	skip                     // never attempt the period here
	askAgain                 // the fleet's record could not be read: ask after RetryDelay
)

// join decides whether this server, which reached period p at t (on its
// clock) and does not contend for it yet, begins to contend for it.
func join(ctx context.Context, cfg *Config, log *slog.Logger, p Period, t, started time.Time) decision {
	late := t.Sub(p.Start).Round(time.Millisecond)
	if window := cfg.Window(p); t.Before(window) {
		if cfg.History == nil || !p.Start.Before(started) {
			return enter // it saw the period begin, or was asked to catch up
		}
		// Catching up a period that began before this process started:
		// only for a fleet that ran the schedule before.
		hctx, cancel := context.WithTimeout(ctx, window.Sub(t))
		defer cancel()
		seen, err := cfg.History(hctx, p)
		switch {
		case ctx.Err() != nil:
			return askAgain
		case err != nil:
			log.Warn("period not attempted yet: its history could not be read", "period", p.Key(), "err", err)
			return askAgain
		case !seen:
			log.Info("period skipped: it began before this server started and the fleet has no record of an earlier period (first start); --catch-up-first runs it", "period", p.Key())
			return skip
		}
		return enter
	}
	// After the window a server only joins a period the fleet is at work
	// on: its run began in time, and this server is a standby for it.
	if cfg.Underway == nil {
		log.Info("period skipped: reached after its window", "period", p.Key(), "late", late)
		return skip
	}
	uctx, cancel := context.WithTimeout(ctx, p.End.Sub(t))
	defer cancel()
	busy, err := cfg.Underway(uctx, p)
	switch {
	case ctx.Err() != nil:
		return askAgain
	case err != nil:
		log.Warn("period not attempted yet: reached after its window, and whether the fleet is at work on it could not be read", "period", p.Key(), "err", err)
		return askAgain
	case !busy:
		log.Info("period skipped: reached after its window, and no server is at work on it", "period", p.Key(), "late", late)
		return skip
	}
	log.Info("period joined after its window: the fleet is at work on it", "period", p.Key(), "late", late)
	return enter
}

var errNoNext = errors.New("no scheduled time in the next five years")

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}
