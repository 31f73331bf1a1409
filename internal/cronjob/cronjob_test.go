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
			// The window bounds when the server joins, not how long it
			// waits: the attempt's wait lasts until the period's end.
			if c := a.get()[0]; tc.catchUp == 40*time.Second && !c.deadline.Equal(start.Add(time.Minute)) {
				t.Errorf("deadline %v, want the period's end %v", c.deadline, start.Add(time.Minute))
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

// A server that starts inside a period catches it up
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

// fleetLock plays, for the schedulers of one bubble, what lockd gives
// lockd cron: per period, an exclusive lock whose holders and waiters can
// be seen, and a completion mark. A fake on purpose: the real lock's queue
// and mark are exercised against real servers in cmd/lockd/fleettest;
// here only the scheduler's timing is under test, in virtual time.
type fleetLock struct {
	mu      sync.Mutex
	slots   map[string]chan struct{} // a buffered slot per period: held when full
	waiting map[string]int
	marked  map[string]string // period → server whose job succeeded
	runs    []jobRun
}

// jobRun is one start of the job.
type jobRun struct {
	key, server string
	at          time.Time
}

func (r jobRun) String() string {
	return r.key + " by " + r.server + " at " + r.at.UTC().Format(time.RFC3339)
}

func newFleetLock() *fleetLock {
	return &fleetLock{slots: map[string]chan struct{}{}, waiting: map[string]int{}, marked: map[string]string{}}
}

func (l *fleetLock) slot(key string) chan struct{} {
	s, ok := l.slots[key]
	if !ok {
		s = make(chan struct{}, 1)
		l.slots[key] = s
	}
	return s
}

// busy is what History and Underway read: the period's lock held, waited
// for or marked done.
func (l *fleetLock) busy(_ context.Context, p Period) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := p.Key()
	_, done := l.marked[key]
	return done || len(l.slot(key)) > 0 || l.waiting[key] > 0, nil
}

// server returns the Attempt of one server: wait for the period's lock
// until ctx ends, then run the job for jobTime unless the server dies
// first (its lock is then freed, as a session expiry would).
func (l *fleetLock) server(name string, jobTime time.Duration, dead <-chan struct{}) func(context.Context, Period) Outcome {
	return func(ctx context.Context, p Period) Outcome {
		key := p.Key()
		l.mu.Lock()
		s := l.slot(key)
		l.waiting[key]++
		l.mu.Unlock()
		select {
		case s <- struct{}{}:
		case <-ctx.Done():
			l.mu.Lock()
			l.waiting[key]--
			l.mu.Unlock()
			return Failed
		}
		l.mu.Lock()
		l.waiting[key]--
		if _, done := l.marked[key]; done {
			<-s
			l.mu.Unlock()
			return Done
		}
		l.runs = append(l.runs, jobRun{key, name, time.Now()})
		l.mu.Unlock()
		select {
		case <-time.After(jobTime):
			l.mu.Lock()
			l.marked[key] = name
			l.mu.Unlock()
			<-s
			return Done
		case <-dead:
			<-s
			return Failed
		}
	}
}

func (l *fleetLock) get() ([]jobRun, map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]string{}
	for k, v := range l.marked {
		m[k] = v
	}
	return append([]jobRun(nil), l.runs...), m
}

// The catch-up window bounds when a server
// begins to contend for a period, not how long a standby waits. A nightly
// 3 h job (02:00, --catch-up 1h) whose runner dies at 03:30: the standby
// takes the lock then and runs the job, whether it was waiting since
// before 02:00, joined late inside the window (the runner's hold is its
// record), or was restarted after the window while the runner held the
// lock (it joins the run under way).
func TestRunStandbyOutlastsWindow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		standby time.Duration // when the standby starts, after 00:00
	}{
		{"waiting since before the period", time.Hour},
		{"joined late inside the window", 2*time.Hour + 40*time.Minute},
		{"restarted after the window while the runner holds", 3*time.Hour + 10*time.Minute},
	} {
		synctest.Test(t, func(t *testing.T) {
			day := time.Now() // 2000-01-01T00:00:00Z
			sched := mustParse(t, "0 2 * * *", nil)
			l := newFleetLock()
			dead := make(chan struct{})
			cfg := func(name string, behind time.Duration, dead <-chan struct{}) Config {
				return Config{
					Schedule:   sched,
					Now:        func() time.Time { return time.Now().Add(-behind) },
					CatchUp:    time.Hour,
					RetryDelay: 10 * time.Second,
					History:    l.busy,
					Underway:   l.busy,
					Attempt:    l.server(name, 3*time.Hour, dead),
				}
			}
			ctxA, killA := context.WithCancel(t.Context())
			ctxB, stopB := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := Run(ctxA, cfg("runner", 0, dead)); err != nil {
					t.Error(err)
				}
			})
			time.Sleep(tc.standby)
			wg.Go(func() {
				// Its clock is a second behind, so the runner takes the
				// lock first at 02:00 whatever the goroutines' order.
				if err := Run(ctxB, cfg("standby", time.Second, nil)); err != nil {
					t.Error(err)
				}
			})
			time.Sleep(3*time.Hour + 30*time.Minute - tc.standby)
			close(dead) // the runner dies 1h30 into its job
			killA()
			time.Sleep(4 * time.Hour) // to 07:30: the standby's job ends at 06:30
			stopB()
			wg.Wait()

			key := day.Add(2 * time.Hour).UTC().Format(time.RFC3339)
			runs, marked := l.get()
			want := []jobRun{{key, "runner", day.Add(2 * time.Hour)}, {key, "standby", day.Add(3*time.Hour + 30*time.Minute)}}
			if len(runs) != len(want) {
				t.Fatalf("%s: job runs %v, want %v", tc.name, runs, want)
			}
			for i := range runs {
				if runs[i].key != want[i].key || runs[i].server != want[i].server || !runs[i].at.Equal(want[i].at) {
					t.Errorf("%s: job runs %v, want %v", tc.name, runs, want)
				}
			}
			if marked[key] != "standby" {
				t.Errorf("%s: period %s marked by %q, want the standby", tc.name, key, marked[key])
			}
		})
	}
}

// A first start after the window, with no server at work on the period,
// does not run it (nor asks History): the first-start protection holds
// after the window as inside it. The next period runs at its start.
func TestRunFirstStartAfterWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		day := time.Now()
		l := newFleetLock()
		time.Sleep(3*time.Hour + 10*time.Minute) // a deploy at 03:10, the 02:00 run never began
		var historyAsked, underwayAsked []string
		var mu sync.Mutex
		runFor(t, Config{
			Schedule:   mustParse(t, "0 2 * * *", nil),
			CatchUp:    time.Hour,
			RetryDelay: 10 * time.Second,
			History: func(ctx context.Context, p Period) (bool, error) {
				mu.Lock()
				historyAsked = append(historyAsked, p.Key())
				mu.Unlock()
				return l.busy(ctx, p)
			},
			Underway: func(ctx context.Context, p Period) (bool, error) {
				mu.Lock()
				underwayAsked = append(underwayAsked, p.Key())
				mu.Unlock()
				return l.busy(ctx, p)
			},
			Attempt: l.server("new", time.Minute, nil),
		}, 24*time.Hour) // to 03:10 the next day
		runs, _ := l.get()
		next := day.Add(26 * time.Hour)
		if len(runs) != 1 || !runs[0].at.Equal(next) || runs[0].key != next.UTC().Format(time.RFC3339) {
			t.Errorf("job runs %v, want only the next period's, at %v", runs, next)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(historyAsked) != 0 || len(underwayAsked) != 1 || underwayAsked[0] != day.Add(2*time.Hour).UTC().Format(time.RFC3339) {
			t.Errorf("History asked for %v, Underway for %v; want none, then the period under way at start only", historyAsked, underwayAsked)
		}
	})
}

// A failed run is retried after RetryDelay until the period ends, not
// only within the catch-up window; then the next period starts fresh.
func TestRunRetryUntilPeriodEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var a attempts
		runFor(t, Config{
			Schedule:   mustParse(t, "0 */2 * * *", nil),
			CatchUp:    30 * time.Minute,
			RetryDelay: 10 * time.Minute,
			Attempt: func(ctx context.Context, p Period) Outcome {
				a.record(ctx, p)
				time.Sleep(2 * time.Minute)
				return Failed // always
			},
		}, 2*time.Hour+5*time.Minute)
		var got []string
		for _, c := range a.get() {
			got = append(got, c.at.Sub(start).String())
			if wantEnd := c.at.Truncate(2 * time.Hour).Add(2 * time.Hour); !c.deadline.Equal(wantEnd) {
				t.Errorf("attempt at %v: deadline %v, want the period's end %v", c.at, c.deadline, wantEnd)
			}
		}
		// Attempts 12 min apart (2 min job + 10 min delay) through the
		// 2 h period; after the one at 1h48 the next would start at its
		// end. Then the next period, at its start.
		want := "0s 12m0s 24m0s 36m0s 48m0s 1h0m0s 1h12m0s 1h24m0s 1h36m0s 1h48m0s 2h0m0s"
		if strings.Join(got, " ") != want {
			t.Errorf("attempts at %v, want %s", got, want)
		}
	})
}

// A server that was running but reaches a period only after its window
// (paused, or its clock stood still, from 01:59 to 03:10) is a late
// server like one that starts then: it joins the 02:00 period only if the
// fleet is at work on it, and then waits until the period's end.
func TestRunWakeAfterWindow(t *testing.T) {
	for _, busy := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			day := time.Now()
			stuck, wake := day.Add(time.Hour+59*time.Minute), day.Add(3*time.Hour+10*time.Minute)
			var a attempts
			runFor(t, Config{
				Schedule:   mustParse(t, "0 2 * * *", nil),
				CatchUp:    time.Hour,
				RetryDelay: 10 * time.Second,
				Now: func() time.Time {
					if n := time.Now(); n.Before(wake) && n.After(stuck) {
						return stuck
					}
					return time.Now()
				},
				History: func(context.Context, Period) (bool, error) { t.Error("History asked"); return true, nil },
				Underway: func(_ context.Context, p Period) (bool, error) {
					// Yesterday's period, under way at the start, is not.
					return busy && p.Start.Equal(day.Add(2*time.Hour)), nil
				},
				Attempt: func(ctx context.Context, p Period) Outcome {
					a.record(ctx, p)
					return Done
				},
			}, 4*time.Hour)
			calls := a.get()
			switch {
			case !busy && len(calls) != 0:
				t.Errorf("nobody at work: attempts %v, want the period skipped", calls)
			case busy && (len(calls) != 1 || !calls[0].at.Equal(wake) || !calls[0].deadline.Equal(day.Add(26*time.Hour))):
				t.Errorf("fleet at work: attempts %v, want one at %v waiting until the period's end", calls, wake)
			}
		})
	}
}
