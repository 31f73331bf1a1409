package cronjob

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func mustParse(t *testing.T, spec string, loc *time.Location) *Schedule {
	t.Helper()
	s, err := Parse(spec, loc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParse(t *testing.T) {
	for _, spec := range []string{"* * * * *", "*/5 9-17 * * 1-5", "0 0 1 * *", "@hourly", "@daily", "@monthly", "0 12 * JAN,JUL SUN"} {
		if _, err := Parse(spec, nil); err != nil {
			t.Errorf("Parse(%q): %v", spec, err)
		}
	}
	for _, spec := range []string{"", "* * * *", "* * * * * *", "61 * * * *", "@every 1m", "CRON_TZ=UTC * * * * *", "TZ=UTC * * * * *", "@reboot", "bogus"} {
		if _, err := Parse(spec, nil); err == nil {
			t.Errorf("Parse(%q): no error", spec)
		}
	}
}

func TestPeriodAt(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skipf("no tzdata: %v", err)
	}
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		spec       string
		loc        *time.Location
		at         string
		start, end string
	}{
		{"* * * * *", nil, "2026-12-01T02:03:04Z", "2026-12-01T02:03:00Z", "2026-12-01T02:04:00Z"},
		{"* * * * *", nil, "2026-12-01T02:03:00Z", "2026-12-01T02:03:00Z", "2026-12-01T02:04:00Z"},
		{"*/15 * * * *", nil, "2026-12-01T02:14:59.9Z", "2026-12-01T02:00:00Z", "2026-12-01T02:15:00Z"},
		{"0 9 * * 1-5", paris, "2026-12-05T12:00:00Z", "2026-12-04T08:00:00Z", "2026-12-07T08:00:00Z"}, // Sat: Friday's run, until Monday 9:00 Paris
		{"0 9 * * 1-5", paris, "2026-07-01T07:00:00Z", "2026-07-01T07:00:00Z", "2026-07-02T07:00:00Z"}, // summer time: 9:00 Paris is 7:00 UTC
		{"@monthly", nil, "2026-03-31T23:59:59Z", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"},
		{"0 0 29 2 *", nil, "2031-01-01T00:00:00Z", "2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"},
	} {
		p, ok := mustParse(t, tc.spec, tc.loc).At(utc(tc.at))
		if !ok || !p.Start.Equal(utc(tc.start)) || !p.End.Equal(utc(tc.end)) {
			t.Errorf("%q at %s: got [%v, %v) ok=%v, want [%s, %s)", tc.spec, tc.at, p.Start.UTC(), p.End.UTC(), ok, tc.start, tc.end)
		}
	}
	// The key is the start in UTC whatever the zone.
	p, _ := mustParse(t, "0 9 * * *", paris).At(utc("2026-12-01T09:00:00Z"))
	if got, want := p.Key(), "2026-12-01T08:00:00Z"; got != want {
		t.Errorf("Key: got %s, want %s", got, want)
	}
}

// attempts records the calls of Attempt: the period and the real (bubble)
// time of the call.
type attempts struct {
	mu    sync.Mutex
	calls []call
}

type call struct {
	key      string
	at       time.Time
	deadline time.Time
}

func (a *attempts) record(ctx context.Context, p Period) {
	d, _ := ctx.Deadline()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, call{p.Key(), time.Now(), d})
}

func (a *attempts) get() []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]call(nil), a.calls...)
}

// runFor runs the scheduler for d of bubble time and stops it.
func runFor(t *testing.T, cfg Config, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	time.Sleep(d)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Every period is attempted once, at its start, when every attempt succeeds.
func TestRunEveryPeriodOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now() // the bubble starts at 2000-01-01T00:00:00Z
		var a attempts
		runFor(t, Config{
			Schedule:   mustParse(t, "* * * * *", nil),
			RetryDelay: 10 * time.Second,
			Attempt: func(ctx context.Context, p Period) Outcome {
				a.record(ctx, p)
				time.Sleep(3 * time.Second) // the job
				return Done
			},
		}, 5*time.Minute-time.Second)
		calls := a.get()
		if len(calls) != 5 {
			t.Fatalf("got %d attempts, want 5: %v", len(calls), calls)
		}
		for i, c := range calls {
			want := start.Add(time.Duration(i) * time.Minute)
			if c.key != want.UTC().Format(time.RFC3339) || !c.at.Equal(want) || !c.deadline.Equal(want.Add(time.Minute)) {
				t.Errorf("attempt %d: got %+v, want period %v attempted at its start, deadline its end", i, c, want)
			}
		}
	})
}

// A scheduler clock 8 s ahead attempts each period 8 s early in real
// time, one 8 s behind 8 s late: the periods (keys) are the same.
func TestRunClockOffset(t *testing.T) {
	for _, off := range []time.Duration{8 * time.Second, -8 * time.Second} {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			var a attempts
			runFor(t, Config{
				Schedule:   mustParse(t, "* * * * *", nil),
				RetryDelay: 10 * time.Second,
				Now:        func() time.Time { return time.Now().Add(off) },
				Attempt: func(ctx context.Context, p Period) Outcome {
					a.record(ctx, p)
					return Done
				},
			}, 3*time.Minute-10*time.Second)
			calls := a.get()
			// The clock starts inside a period (the current one when ahead,
			// the previous one when behind): caught up at once. Later
			// periods start off early (ahead) or late (behind) in real time.
			first := start
			if off < 0 {
				first = start.Add(-time.Minute)
			}
			wantN := 3 // at 0, 52 s, 1 m 52 s
			if off < 0 {
				wantN = 4 // at 0, 8 s, 1 m 8 s, 2 m 8 s
			}
			if len(calls) != wantN {
				t.Fatalf("offset %v: got %d attempts, want %d: %v", off, len(calls), wantN, calls)
			}
			for i, c := range calls {
				p := first.Add(time.Duration(i) * time.Minute)
				want := p.Add(-off)
				if i == 0 {
					want = start
				}
				if c.key != p.UTC().Format(time.RFC3339) || !c.at.Equal(want) {
					t.Errorf("offset %v, attempt %d: got %+v, want period %v at %v", off, i, c, p, want)
				}
			}
		})
	}
}

// A server that starts late runs the current period at once when the
// catch-up window allows it, and skips it otherwise.
func TestRunCatchUp(t *testing.T) {
	for _, tc := range []struct {
		catchUp time.Duration
		want    []time.Duration // attempts, after the bubble's start
	}{
		{0, []time.Duration{30 * time.Second, 60 * time.Second}},
		{40 * time.Second, []time.Duration{30 * time.Second, 60 * time.Second}},
		{20 * time.Second, []time.Duration{60 * time.Second}},
	} {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			time.Sleep(30 * time.Second) // start late, mid-period
			var a attempts
			runFor(t, Config{
				Schedule:   mustParse(t, "* * * * *", nil),
				CatchUp:    tc.catchUp,
				RetryDelay: 10 * time.Second,
				Attempt: func(ctx context.Context, p Period) Outcome {
					a.record(ctx, p)
					return Done
				},
			}, 50*time.Second)
			var got []time.Duration
			for _, c := range a.get() {
				got = append(got, c.at.Sub(start))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("catch-up %v: attempts at %v, want %v", tc.catchUp, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("catch-up %v: attempts at %v, want %v", tc.catchUp, got, tc.want)
				}
			}
			// The window ends the attempt's wait.
			if c := a.get()[0]; tc.catchUp == 40*time.Second && !c.deadline.Equal(start.Add(40*time.Second)) {
				t.Errorf("deadline %v, want the catch-up window's end %v", c.deadline, start.Add(40*time.Second))
			}
		})
	}
}

// A failed attempt is repeated every RetryDelay while the window lasts,
// then the period is given up here; a success ends the retries.
func TestRunRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var a attempts
		runFor(t, Config{
			Schedule:   mustParse(t, "* * * * *", nil),
			RetryDelay: 10 * time.Second,
			Attempt: func(ctx context.Context, p Period) Outcome {
				a.record(ctx, p)
				time.Sleep(2 * time.Second)
				if p.Start.Equal(start) {
					return Failed // the first period always fails
				}
				if n := len(a.get()); n < 8 {
					return Failed // the second one fails twice
				}
				return Done
			},
		}, 2*time.Minute-time.Second)
		var got []string
		for _, c := range a.get() {
			got = append(got, c.at.Sub(start).String())
		}
		// Attempts 12 s apart (2 s job + 10 s delay); the sixth in the
		// first period would start at 60 s, after its end.
		want := "0s 12s 24s 36s 48s 1m0s 1m12s 1m24s"
		if strings.Join(got, " ") != want {
			t.Errorf("attempts at %v, want %s", got, want)
		}
	})
}

// Cancelling ctx stops the scheduler while it waits for a period and
// while an attempt waits for its lock.
func TestRunStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- Run(ctx, Config{
				Schedule: mustParse(t, "0 0 1 1 *", nil),
				Attempt: func(ctx context.Context, p Period) Outcome {
					<-ctx.Done()
					return Failed
				},
			})
		}()
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		time.Sleep(time.Hour) // not a scheduled time: Run sleeps
		go func() {
			done <- Run(ctx, Config{
				Schedule: mustParse(t, "0 0 1 1 *", nil),
				CatchUp:  time.Minute,
				Attempt: func(ctx context.Context, p Period) Outcome {
					t.Error("attempted a period reached after its window")
					return Done
				},
			})
		}()
		synctest.Wait()
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	})
}

// Issue 17, item 13: a server that starts inside a period catches it up
// only when History finds a record of an earlier run (a first deploy does
// not run the period it did not see begin); History is asked only for
// that period, and an error is retried like a failed attempt. Periods
// that begin while the server runs are attempted at their start.
func TestRunFirstStart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history func(n int) (bool, error) // the n-th call, from 0
		want    []time.Duration           // attempts, after the bubble's start
		asked   int                       // History calls
	}{
		{"no record", func(int) (bool, error) { return false, nil }, []time.Duration{time.Hour}, 1},
		{"record", func(int) (bool, error) { return true, nil }, []time.Duration{10 * time.Minute, time.Hour}, 1},
		{"error then record", func(n int) (bool, error) {
			if n == 0 {
				return false, errors.New("cluster down")
			}
			return true, nil
		}, []time.Duration{10*time.Minute + 30*time.Second, time.Hour}, 2},
	} {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			time.Sleep(10 * time.Minute) // a deploy 10 minutes into the hour
			var a attempts
			var mu sync.Mutex
			var asked []string
			runFor(t, Config{
				Schedule:   mustParse(t, "0 * * * *", nil),
				RetryDelay: 30 * time.Second,
				History: func(ctx context.Context, p Period) (bool, error) {
					mu.Lock()
					defer mu.Unlock()
					asked = append(asked, p.Key())
					return tc.history(len(asked) - 1)
				},
				Attempt: func(ctx context.Context, p Period) Outcome {
					a.record(ctx, p)
					return Done
				},
			}, 55*time.Minute)
			var got []time.Duration
			for _, c := range a.get() {
				got = append(got, c.at.Sub(start))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%s: attempts at %v, want %v", tc.name, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("%s: attempts at %v, want %v", tc.name, got, tc.want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(asked) != tc.asked {
				t.Errorf("%s: History asked for %v, want %d calls for the period under way at start", tc.name, asked, tc.asked)
			}
			for _, k := range asked {
				if k != start.UTC().Format(time.RFC3339) {
					t.Errorf("%s: History asked for %s, want only %s", tc.name, k, start.UTC().Format(time.RFC3339))
				}
			}
		})
	}
}
