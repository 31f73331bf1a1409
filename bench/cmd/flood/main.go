// Command flood measures a flood of refused calls with real processes: a
// `lockd serve` process, a flooder process and a well-behaved process.
// bench/flood.sh runs the three; see bench/README.md.
//
//	flood hammer --endpoint URL --token-file F [--sessions 2000] [--clients 1]
//	             [--lock hot] [--duration 60s] [--ready FILE]
//	flood good   --endpoint URL --token-file F [--clients 10] [--phase 5s]
//	             [--idle-done FILE] [--wait-for FILE] [--server-pid PID]
//
// hammer opens --sessions sessions over --clients clients and runs a
// TryLock loop (unlock when granted, no backoff) in each, on one lock,
// until --duration passes or it is signalled; it creates FILE --ready once
// every loop runs, and prints its counts on exit.
//
// good runs --clients clients, each with its own connection, session and
// lock, locking and unlocking for --phase (idle), creates --idle-done,
// waits for --wait-for to exist (the flooder is running), runs a second
// --phase (flood), then prints both phases' p50 and p99, the ratio, the
// server's CPU in each phase (from /proc/PID/stat), the limit hits from
// /metrics and whether /healthz still answers.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "flood: %v\n", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: flood hammer|good [flags]")
	}
	switch args[0] {
	case "hammer":
		return hammer(ctx, args[1:], out)
	case "good":
		return good(ctx, args[1:], out)
	}
	return fmt.Errorf("unknown command %q (hammer or good)", args[0])
}

func hammer(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("flood hammer", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "lockd API URL")
	tokenFile := fs.String("token-file", "", "the flooder identity's token")
	sessions := fs.Int("sessions", 2000, "flooding sessions")
	clients := fs.Int("clients", 1, "clients (connections) the sessions are spread over")
	lock := fs.String("lock", "hot", "the lock every session hammers")
	duration := fs.Duration("duration", 60*time.Second, "stop after this long (bound)")
	ready := fs.String("ready", "", "create this file once every loop runs")
	pauseFile := fs.String("pause-file", "", "while this file exists, the loops pause")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var paused atomic.Bool
	if *pauseFile != "" {
		go func() {
			for ctx.Err() == nil {
				_, err := os.Stat(*pauseFile)
				paused.Store(err == nil)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	var cs []*lockd.Client
	for range max(*clients, 1) {
		c, err := lockd.New(lockd.WithEndpoints(*endpoint), lockd.WithTokenFile(*tokenFile), lockd.WithStream(streamOn()))
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		cs = append(cs, c)
	}
	var ss []*lockd.Session
	for i := range *sessions {
		s, err := cs[i%len(cs)].NewSession(ctx, lockd.WithTTL(30*time.Second))
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		ss = append(ss, s)
	}
	var granted, busy, limited, other atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for _, s := range ss {
		wg.Go(func() {
			m := s.NewMutex(*lock)
			for ctx.Err() == nil {
				if paused.Load() {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				err := m.TryLock(ctx)
				switch {
				case err == nil:
					granted.Add(1)
					_ = m.Unlock(ctx)
				case errors.Is(err, lockd.ErrBusy):
					busy.Add(1)
				case errors.Is(err, lockd.ErrRateLimited):
					limited.Add(1)
				case ctx.Err() != nil:
				default:
					other.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	if *ready != "" {
		if err := os.WriteFile(*ready, nil, 0o644); err != nil {
			cancel()
			wg.Wait()
			return err
		}
	}
	wg.Wait()
	d := time.Since(start).Seconds()
	n := granted.Load() + busy.Load() + limited.Load() + other.Load()
	fmt.Fprintf(out, "flooder: %d sessions over %d clients, %.1f s: %d calls answered (%.0f/s): %d granted, %d busy, %d rate-limited, %d other",
		len(ss), len(cs), d, n, float64(n)/d, granted.Load(), busy.Load(), limited.Load(), other.Load())
	if e, ok := firstErr.Load().(string); ok {
		fmt.Fprintf(out, " (first other: %s)", e)
	}
	fmt.Fprintf(out, "; client CPU %s\n", cpuOf("self", d))
	return nil
}

func good(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("flood good", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "lockd API URL")
	tokenFile := fs.String("token-file", "", "the good identity's token")
	clients := fs.Int("clients", 10, "well-behaved clients, each its own connection, session and lock")
	prefix := fs.String("prefix", "good/", "lock name prefix")
	phase := fs.Duration("phase", 5*time.Second, "length of each phase (idle, flood)")
	idleDone := fs.String("idle-done", "", "create this file when the idle phase ends")
	waitFor := fs.String("wait-for", "", "start the flood phase once this file exists")
	waitMax := fs.Duration("wait-max", 3*time.Minute, "give up waiting for --wait-for after this long")
	serverPID := fs.Int("server-pid", 0, "the server's pid, to read its CPU time (Linux /proc)")
	rounds := fs.Int("rounds", 0, "after the flood phase, this many rounds of a --window flood then a --window pause of the flooder (--pause-file), measured apart: both see the same background load")
	window := fs.Duration("window", 2*time.Second, "length of each interleaved window")
	pauseFile := fs.String("pause-file", "", "the flooder pauses while this file exists (with --rounds)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var ms []*lockd.Mutex
	for i := range *clients {
		c, err := lockd.New(lockd.WithEndpoints(*endpoint), lockd.WithTokenFile(*tokenFile), lockd.WithStream(streamOn()))
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		s, err := c.NewSession(ctx, lockd.WithTTL(10*time.Second))
		if err != nil {
			return err
		}
		ms = append(ms, s.NewMutex(fmt.Sprintf("%s%d", *prefix, i)))
	}
	pid := "self"
	if *serverPID > 0 {
		pid = strconv.Itoa(*serverPID)
	}
	idle := measure(ctx, ms, *phase, pid)
	if *idleDone != "" {
		if err := os.WriteFile(*idleDone, nil, 0o644); err != nil {
			return err
		}
	}
	if *waitFor != "" {
		deadline := time.Now().Add(*waitMax)
		for {
			if _, err := os.Stat(*waitFor); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not appear within %v", *waitFor, *waitMax)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	flood := measure(ctx, ms, *phase, pid)
	ratio := 0.0
	if idle.p99 > 0 {
		ratio = float64(flood.p99) / float64(idle.p99)
	}
	fmt.Fprintf(out, "good clients idle:  %s\n", idle)
	fmt.Fprintf(out, "good clients flood: %s\n", flood)
	fmt.Fprintf(out, "p99 flood/idle: %.1fx (p50 %.1fx; p99 after each phase's first second %.1fx)\n", ratio,
		float64(flood.p50)/float64(max(idle.p50, 1)), float64(flood.p99Settled)/float64(max(idle.p99Settled, 1)))
	if *rounds > 0 && *pauseFile != "" {
		var on, off []phaseResult
		for range *rounds {
			on = append(on, measure(ctx, ms, *window, pid))
			if err := os.WriteFile(*pauseFile, nil, 0o644); err != nil {
				return err
			}
			settle(ctx)
			off = append(off, measure(ctx, ms, *window, pid))
			if err := os.Remove(*pauseFile); err != nil {
				return err
			}
			settle(ctx)
		}
		fmt.Fprintf(out, "interleaved, %d rounds of %v flood / %v flooder paused:\n", *rounds, *window, *window)
		var ratios []float64
		for i := range on {
			r := float64(on[i].p99) / float64(max(off[i].p99, 1))
			ratios = append(ratios, r)
			fmt.Fprintf(out, "  round %d: paused p50 %v p99 %v (server CPU %s) | flood p50 %v p99 %v (server CPU %s) | p99 %.1fx\n", i+1,
				off[i].p50.Round(10*time.Microsecond), off[i].p99.Round(10*time.Microsecond), off[i].serverCPU,
				on[i].p50.Round(10*time.Microsecond), on[i].p99.Round(10*time.Microsecond), on[i].serverCPU, r)
		}
		slices.Sort(ratios)
		fmt.Fprintf(out, "  median p99 flood/paused: %.1fx (range %.1f–%.1fx)\n", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	}
	fmt.Fprintf(out, "limit hits: %s\n", limitHits(ctx, *endpoint))
	fmt.Fprintf(out, "server up after the flood (/healthz): %v\n", healthy(ctx, *endpoint))
	return nil
}

// settle waits for the flooder to see its pause file change and its
// calls in flight to end.
func settle(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(300 * time.Millisecond):
	}
}

type phaseResult struct {
	n, failed  int
	p50, p99   time.Duration
	p99Settled time.Duration // p99 of the acquires started after the phase's first second
	serverCPU  string
}

func (r phaseResult) String() string {
	return fmt.Sprintf("%d acquires, p50 %v, p99 %v (after the first second: %v), %d failed; server CPU %s",
		r.n, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.p99Settled.Round(10*time.Microsecond), r.failed, r.serverCPU)
}

// measure runs the clients' lock/unlock loops for d and returns their
// acquire latencies' percentiles and the server's CPU meanwhile.
func measure(ctx context.Context, ms []*lockd.Mutex, d time.Duration, pid string) phaseResult {
	var mu sync.Mutex
	var lat, settled []time.Duration
	var failed atomic.Int64
	var wg sync.WaitGroup
	c0 := cpuTicks(pid)
	start := time.Now()
	end := start.Add(d)
	for _, m := range ms {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				t0 := time.Now()
				if err := m.Lock(ctx); err != nil {
					failed.Add(1)
					continue
				}
				l := time.Since(t0)
				mu.Lock()
				lat = append(lat, l)
				if t0.Sub(start) >= time.Second {
					settled = append(settled, l)
				}
				mu.Unlock()
				if err := m.Unlock(ctx); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	slices.Sort(lat)
	slices.Sort(settled)
	pct := func(lat []time.Duration, p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(float64(len(lat))*p))]
	}
	cpu := "unknown"
	if c0 >= 0 {
		if c1 := cpuTicks(pid); c1 >= 0 {
			cpu = fmt.Sprintf("%.0f%%", 100*float64(c1-c0)/clockTicks/secs)
		}
	}
	return phaseResult{n: len(lat), failed: int(failed.Load()), p50: pct(lat, 0.5), p99: pct(lat, 0.99), p99Settled: pct(settled, 0.99), serverCPU: cpu}
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on every
// Linux architecture Go supports).
const clockTicks = 100

// cpuTicks returns a process's user+system time in clock ticks, or -1.
func cpuTicks(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	// Fields 14 and 15, counted after the ")" that ends the command name.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return -1
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

// cpuOf formats a process's CPU time over its life as a share of secs.
func cpuOf(pid string, secs float64) string {
	t := cpuTicks(pid)
	if t < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f s (%.0f%% of one core over the flood)", float64(t)/clockTicks, 100*float64(t)/clockTicks/secs)
}

// limitHits returns the lockd_limit_hits_total lines of /metrics.
func limitHits(ctx context.Context, endpoint string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/metrics", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var hits []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "lockd_limit_hits_total{") {
			hits = append(hits, l)
		}
	}
	if len(hits) == 0 {
		return "none"
	}
	return strings.Join(hits, ", ")
}

// healthy reports whether /healthz answers 200.
func healthy(ctx context.Context, endpoint string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// streamOn reports whether the clients use the session stream: unless
// $LOCKD_STREAM is off, 0 or false (flood.sh's unary runs). The client
// library reads no environment.
func streamOn() bool {
	switch strings.TrimSpace(os.Getenv("LOCKD_STREAM")) {
	case "off", "0", "false":
		return false
	}
	return true
}
