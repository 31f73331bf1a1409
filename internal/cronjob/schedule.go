package cronjob

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// parser reads the standard five fields (minute hour day-of-month month
// day-of-week) and the descriptors (@hourly, @daily, …). "@every D" is
// refused in Parse: its times depend on when each server started, so the
// servers of a fleet would not agree on the periods.
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// maxLookback bounds the search for the latest scheduled time before now.
// The parser itself gives up on schedules with no time in five years.
const maxLookback = 10 * 366 * 24 * time.Hour

// Schedule is a parsed cron schedule in a time zone. Every server of a
// fleet that parses the same line in the same zone computes the same
// periods, whatever its local zone.
type Schedule struct {
	spec  string
	sched *cron.SpecSchedule
}

// Parse reads a standard 5-field cron line ("*/5 * * * *") or a descriptor
// (@hourly, @daily, @weekly, @monthly, @yearly), evaluated in loc (nil
// means UTC). A time zone inside the line (CRON_TZ=, TZ=) and "@every" are
// refused: the zone comes from loc, and "@every" has no fixed periods.
func Parse(spec string, loc *time.Location) (*Schedule, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case strings.HasPrefix(spec, "TZ="), strings.HasPrefix(spec, "CRON_TZ="):
		return nil, fmt.Errorf("schedule %q: give the time zone with --tz, not in the schedule", spec)
	case strings.HasPrefix(spec, "@every"):
		return nil, fmt.Errorf("schedule %q: @every is not supported: its times depend on when each server started", spec)
	}
	s, err := parser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, err)
	}
	ss, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("schedule %q: unsupported kind of schedule", spec)
	}
	if loc == nil {
		loc = time.UTC
	}
	ss.Location = loc
	return &Schedule{spec: spec, sched: ss}, nil
}

// String returns the schedule as given.
func (s *Schedule) String() string { return s.spec }

// Location returns the time zone the schedule is read in.
func (s *Schedule) Location() *time.Location { return s.sched.Location }

// Next returns the first scheduled time strictly after t, or the zero time
// when there is none within five years.
func (s *Schedule) Next(t time.Time) time.Time { return s.sched.Next(t) }

// errNoPeriod: the schedule has no time before t within maxLookback.
var errNoPeriod = errors.New("no scheduled time before")

// Prev returns the latest scheduled time at or before t, or errNoPeriod.
// The parser only searches forward: Prev doubles a look-back distance d
// until a scheduled time lies in (t-d, t], then walks forward to the last
// one, so the walk covers at most the times in (t-d, t-d/2].
func (s *Schedule) Prev(t time.Time) (time.Time, error) {
	// Cron times are whole seconds; so is the search.
	t = t.Truncate(time.Second)
	for d := time.Minute; d <= maxLookback; d *= 2 {
		p := s.Next(t.Add(-d))
		if p.IsZero() || p.After(t) {
			continue
		}
		for {
			n := s.Next(p)
			if n.IsZero() || n.After(t) {
				return p, nil
			}
			p = n
		}
	}
	return time.Time{}, fmt.Errorf("%w %v", errNoPeriod, t)
}

// Period is one scheduled run: from its scheduled time Start to the next
// scheduled time End. Exactly one server runs the job of a period to
// success.
type Period struct {
	// Start is the scheduled time.
	Start time.Time
	// End is the next scheduled time, where the next period starts.
	End time.Time
}

// Key names the period the same way on every server: its start in UTC,
// RFC 3339 (2026-12-01T02:00:00Z).
func (p Period) Key() string { return p.Start.UTC().Format(time.RFC3339) }

// Len is the period's length.
func (p Period) Len() time.Duration { return p.End.Sub(p.Start) }

// At returns the period that contains t (Start ≤ t < End). ok is false when
// the schedule has no time at or before t; then the returned period is the
// next one, which starts after t.
func (s *Schedule) At(t time.Time) (p Period, ok bool) {
	start, err := s.Prev(t)
	if err != nil {
		n := s.Next(t)
		return Period{Start: n, End: s.Next(n)}, false
	}
	return Period{Start: start, End: s.Next(start)}, true
}
