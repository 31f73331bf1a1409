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
	// tries again after the retry delay while the window lasts, and the
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
	// CatchUp is how long after its scheduled time a period may still be
	// started: a server that reaches a period later (it started late, was
	// paused, or its clock is behind) skips it. 0 means until the period
	// ends.
	CatchUp time.Duration
	// RetryDelay is how long this server waits after a failed attempt
	// before it tries the same period again, while its window lasts.
	RetryDelay time.Duration
	// Now reads the scheduler's clock; nil means time.Now. A test shifts it
	// to play a server whose clock is off.
	Now func() time.Time
	// History reports whether the fleet has a record of running the
	// schedule at or just before period p: the period before p done (its
	// completion mark), or a server at work on p or on the period before.
	// Run asks it before catching up a period that began before Run
	// started, and skips the period without such a record: the first start
	// of a fleet (a first deploy on the 20th of the month, say) must not
	// run a period it did not see begin. nil catches up without asking.
	// An error counts as a failed attempt (tried again after RetryDelay).
	History func(ctx context.Context, p Period) (bool, error)
	// Logger receives one line per period decision; nil discards.
	Logger *slog.Logger
	// Attempt tries to run the job of period p. Its ctx ends when p's
	// window ends on the scheduler's clock (the wait for the lock must not
	// outlast it) or when Run's ctx ends; a job already running is not
	// bound by ctx.
	Attempt func(ctx context.Context, p Period) Outcome
}

// Window returns when a period may no longer be started: its end, or
// CatchUp after its start when that comes first.
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
// A period [Start, End) is attempted when the scheduler's clock first
// shows a time inside its window [Start, Window): at once when this server
// starts inside it (catching up, if History finds an earlier run), never
// when it reaches the period after the window (skipping). A failed attempt is repeated after RetryDelay
// while the window lasts. Attempts run one at a time: while a job runs,
// no other period starts on this server.
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
	var handled time.Time // start of the last period done, or given up, here
	var known time.Time   // start of the last period History allowed
	for ctx.Err() == nil {
		t := now()
		p, ok := cfg.Schedule.At(t)
		if ok && p.Start.After(handled) {
			end := cfg.Window(p)
			if !t.Before(end) {
				log.Info("period skipped: reached after its window", "period", p.Key(), "late", t.Sub(p.Start).Round(time.Millisecond))
				handled = p.Start
				continue
			}
			actx, cancel := context.WithTimeout(ctx, end.Sub(t))
			out := Failed
			if cfg.History != nil && p.Start.Before(started) && !known.Equal(p.Start) {
				// Catching up a period that began before this process
				// started: only for a fleet that ran the schedule before.
				seen, err := cfg.History(actx, p)
				switch {
				case err != nil:
					log.Warn("period not attempted: its history could not be read", "period", p.Key(), "err", err)
				case !seen:
					cancel()
					log.Info("period skipped: it began before this server started and the fleet has no record of an earlier period (first start); --catch-up-first runs it", "period", p.Key())
					handled = p.Start
					continue
				default:
					known = p.Start
				}
			}
			if cfg.History == nil || !p.Start.Before(started) || known.Equal(p.Start) {
				out = cfg.Attempt(actx, p)
			}
			cancel()
			if ctx.Err() != nil {
				break
			}
			if out == Done {
				handled = p.Start
				continue
			}
			if now().Add(cfg.RetryDelay).Before(end) {
				log.Info("period still open: trying again", "period", p.Key(), "after", cfg.RetryDelay)
				sleep(ctx, cfg.RetryDelay)
				continue
			}
			log.Warn("period given up here: its window ends before another attempt", "period", p.Key(), "window_end", end.UTC().Format(time.RFC3339))
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
