package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// listWorkload is the workload name of the ListLocks scenario: does a read-only caller paging through a big lock table slow a
// good client's locks?
const listWorkload = "listlocks"

// listOptions are the flags of the listlocks workload.
type listOptions struct {
	locks      int           // locks held during the run
	readers    int           // ListLocks workers, each its own client
	readerRate float64       // calls per second per reader
	pageSize   int           // ListLocks page_size
	rounds     int           // rounds of (matching phase, empty phase)
	phase      time.Duration // each phase's measured length (--duration)
	warmup     time.Duration // unmeasured start of each phase (--warmup)
	ttl        time.Duration
	timeout    time.Duration // one call's bound
	prefix     string
	maxOps     int64 // bound on each loop's calls per phase
}

func (o *listOptions) validate() error {
	switch {
	case o.locks < 0 || o.locks > 1_000_000:
		return fmt.Errorf("--locks %d: want 0 to 1000000", o.locks)
	case o.readers < 1 || o.readers > 256:
		return fmt.Errorf("--readers %d: want 1 to 256", o.readers)
	case o.readerRate <= 0 || o.readerRate > 100_000:
		return fmt.Errorf("--reader-rate %v: want above 0, at most 100000", o.readerRate)
	case o.pageSize < 1 || o.pageSize > 1000:
		return fmt.Errorf("--page-size %d: want 1 to 1000", o.pageSize)
	case o.rounds < 1 || o.rounds > 100:
		return fmt.Errorf("--rounds %d: want 1 to 100", o.rounds)
	case o.phase <= 0 || o.warmup < 0:
		return fmt.Errorf("--duration must be positive and --warmup not negative")
	case o.ttl <= 0 || o.timeout <= 0 || o.maxOps <= 0:
		return fmt.Errorf("--ttl, --timeout and --max-ops must be positive")
	}
	return nil
}

// listLatency is a latency summary in milliseconds.
type listLatency struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

func summarize(h *hdrhistogram.Histogram) listLatency {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return listLatency{Count: h.TotalCount(), P50: ms(h.ValueAtQuantile(50)), P99: ms(h.ValueAtQuantile(99)), Max: ms(h.Max())}
}

// listPhase is what one kind of phase measured, over all rounds.
type listPhase struct {
	// Prefix is the readers' prefix.
	Prefix string `json:"prefix"`
	// Good is the good client's Acquire+Release pairs.
	Good listLatency `json:"good_pair"`
	// GoodPerSecond is its pairs per second.
	GoodPerSecond float64 `json:"good_pairs_per_second"`
	// RoundP99 is the good client's p99 in each round's phase.
	RoundP99 []float64 `json:"round_p99_ms"`
	// Reader is the readers' ListLocks calls.
	Reader listLatency `json:"reader_call"`
	// ReaderPerSecond is each reader's calls per second (mean).
	ReaderPerSecond float64 `json:"reader_calls_per_second_each"`
	// Listed counts the locks the readers' pages returned (none, on the
	// empty prefix).
	Listed int64 `json:"locks_listed"`
	// Errors counts failed calls of the good client and the readers.
	Errors int64 `json:"errors"`
	// ErrorSample is the first error's message.
	ErrorSample string `json:"error_sample,omitempty"`
	seconds     float64
	good, read  *hdrhistogram.Histogram
}

// listReport is the scenario's report.
type listReport struct {
	Workload     string    `json:"workload"`
	Version      string    `json:"version"`
	Endpoints    []string  `json:"endpoints"`
	Locks        int       `json:"locks"`
	SetupSeconds float64   `json:"setup_seconds"`
	Readers      int       `json:"readers"`
	ReaderRate   float64   `json:"reader_rate"`
	PageSize     int       `json:"page_size"`
	Rounds       int       `json:"rounds"`
	PhaseSeconds float64   `json:"phase_seconds"`
	Match        listPhase `json:"match"`
	None         listPhase `json:"none"`
	// Idle is the good client alone (no readers), for reference.
	Idle listPhase `json:"idle"`
	// P99Ratio is the good client's p99 with readers on the locks' prefix
	// over its p99 with readers on a prefix that matches nothing.
	P99Ratio float64 `json:"p99_ratio"`
	// RoundRatios are the same ratio per round (each pair of phases ran
	// back to back, under the same background load).
	RoundRatios []float64 `json:"round_p99_ratios"`
}

// runList runs the listlocks scenario: hold o.locks locks from a few
// sessions, then rounds of three phases — readers listing the held locks'
// prefix, readers listing a prefix that matches nothing, no readers — in
// an order that rotates by round, while one good client takes and releases
// its own lock. Every loop
// is bounded by its phase's end and by o.maxOps calls.
func runList(ctx context.Context, d *benchDriver, o *listOptions, stderr io.Writer) (*listReport, error) {
	r := &listReport{Workload: listWorkload, Locks: o.locks, Readers: o.readers, ReaderRate: o.readerRate,
		PageSize: o.pageSize, Rounds: o.rounds, PhaseSeconds: o.phase.Seconds()}
	held, empty := o.prefix+"/held/", o.prefix+"/none/"
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	newClient := func() (*benchClient, error) {
		c, err := d.newLockdClient()
		if err == nil {
			closers = append(closers, func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.timeout)
				defer cancel()
				_ = c.Close(cctx)
			})
		}
		return c, err
	}

	start := time.Now()
	if err := holdLocks(ctx, o, held, newClient); err != nil {
		return nil, err
	}
	r.SetupSeconds = time.Since(start).Seconds()
	fmt.Fprintf(stderr, "lockd bench: %d locks held under %s in %.1fs\n", o.locks, held, r.SetupSeconds)

	good, err := newClient()
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, o.timeout)
	gs, err := good.c.NewSession(sctx, lockd.WithTTL(o.ttl), lockd.WithOwner("lockd bench good"))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("good client's session: %w", err)
	}
	mu := gs.NewMutex(o.prefix + "/good")
	readers := make([]*benchClient, o.readers)
	for i := range readers {
		if readers[i], err = newClient(); err != nil {
			return nil, err
		}
	}

	r.Match = listPhase{Prefix: held, good: newListHist(), read: newListHist()}
	r.None = listPhase{Prefix: empty, good: newListHist(), read: newListHist()}
	r.Idle = listPhase{good: newListHist(), read: newListHist()}
	phases := []*listPhase{&r.Match, &r.None, &r.Idle}
	for round := range o.rounds {
		p99 := map[*listPhase]float64{}
		for k := range phases { // the order rotates by round
			ph := phases[(round+k)%len(phases)]
			rs := readers
			if ph == &r.Idle {
				rs = nil
			}
			v, err := listPhaseRun(ctx, o, ph, mu, rs)
			if err != nil {
				return nil, err
			}
			p99[ph] = v
		}
		if p99[&r.None] > 0 {
			r.RoundRatios = append(r.RoundRatios, p99[&r.Match]/p99[&r.None])
		}
	}
	for _, ph := range phases {
		ph.Good, ph.Reader = summarize(ph.good), summarize(ph.read)
		if ph.seconds > 0 {
			ph.GoodPerSecond = float64(ph.Good.Count) / ph.seconds
			if ph != &r.Idle {
				ph.ReaderPerSecond = float64(ph.Reader.Count) / ph.seconds / float64(o.readers)
			}
		}
	}
	if r.None.Good.P99 > 0 {
		r.P99Ratio = r.Match.Good.P99 / r.None.Good.P99
	}
	return r, nil
}

func newListHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 60_000_000, 3) }

// holdLocks makes o.locks locks under prefix exist by holding them: up to
// 10 000 per session (below the per-session cap), 32 acquires in flight per
// session, all bounded by o.timeout each and 10 minutes in all.
func holdLocks(ctx context.Context, o *listOptions, prefix string, newClient func() (*benchClient, error)) error {
	const perSession, inFlight = 10_000, 32
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	for first := 0; first < o.locks && ctx.Err() == nil; first += perSession {
		last := min(first+perSession, o.locks)
		c, err := newClient()
		if err != nil {
			fail(err)
			break
		}
		sctx, scancel := context.WithTimeout(ctx, o.timeout)
		s, err := c.c.NewSession(sctx, lockd.WithTTL(o.ttl), lockd.WithOwner("lockd bench holder"))
		scancel()
		if err != nil {
			fail(fmt.Errorf("holder session: %w", err))
			break
		}
		var next atomic.Int64
		next.Store(int64(first))
		for range inFlight {
			wg.Go(func() {
				for ctx.Err() == nil {
					i := next.Add(1) - 1
					if i >= int64(last) {
						return
					}
					actx, acancel := context.WithTimeout(ctx, o.timeout)
					err := s.NewMutex(fmt.Sprintf("%s%07d", prefix, i)).TryLock(actx)
					acancel()
					if err != nil {
						fail(fmt.Errorf("hold lock %d: %w", i, err))
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// listPhaseRun runs one phase: the readers list ph.Prefix while the good
// client takes and releases mu; both are measured after o.warmup. It
// returns the phase's good p99 (ms).
func listPhaseRun(ctx context.Context, o *listOptions, ph *listPhase, mu *lockd.Mutex, readers []*benchClient) (float64, error) {
	start := time.Now()
	from, to := start.Add(o.warmup), start.Add(o.warmup+o.phase)
	pctx, cancel := context.WithDeadline(ctx, to)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu2      sync.Mutex
		errCount atomic.Int64
		listed   atomic.Int64
		sample   string
	)
	fail := func(err error) {
		if pctx.Err() != nil {
			return // cut short by the phase's end
		}
		errCount.Add(1)
		mu2.Lock()
		if sample == "" {
			sample = err.Error()
		}
		mu2.Unlock()
	}
	readHists := make([]*hdrhistogram.Histogram, len(readers))
	for i, rc := range readers {
		readHists[i] = newListHist()
		wg.Go(func() {
			interval := time.Duration(float64(time.Second) / o.readerRate)
			next := start
			for n := int64(0); n < o.maxOps && pctx.Err() == nil; n++ {
				// Paced, one call in flight: a slow call delays the next,
				// it never piles calls up.
				if wait := time.Until(next); wait > 0 {
					t := time.NewTimer(wait)
					select {
					case <-pctx.Done():
						t.Stop()
						return
					case <-t.C:
					}
				}
				next = next.Add(interval)
				if behind := time.Now(); next.Before(behind) {
					next = behind
				}
				cctx, ccancel := context.WithTimeout(pctx, o.timeout)
				t0 := time.Now()
				resp, err := rc.c.Service().ListLocks(cctx, connect.NewRequest(&lockdv1.ListLocksRequest{Prefix: ph.Prefix, PageSize: uint32(o.pageSize)}))
				t1 := time.Now()
				ccancel()
				if err != nil {
					fail(err)
					continue
				}
				listed.Add(int64(len(resp.Msg.Locks)))
				if !t1.Before(from) && t1.Before(to) {
					_ = readHists[i].RecordValue(max(t1.Sub(t0).Microseconds(), 1))
				}
			}
		})
	}
	goodHist := newListHist()
	wg.Go(func() {
		for n := int64(0); n < o.maxOps && pctx.Err() == nil; n++ {
			// Not bounded by the phase: a pair cut in half would leave the
			// lock held into the next phase. The phase waits for it.
			cctx, ccancel := context.WithTimeout(ctx, o.timeout)
			t0 := time.Now()
			err := mu.Lock(cctx)
			if err == nil {
				err = mu.Unlock(cctx)
			}
			t1 := time.Now()
			ccancel()
			if err != nil {
				errCount.Add(1)
				mu2.Lock()
				if sample == "" {
					sample = err.Error()
				}
				mu2.Unlock()
				// Held after a failed release? Let go before the next pair.
				uctx, ucancel := context.WithTimeout(ctx, o.timeout)
				_ = mu.Unlock(uctx)
				ucancel()
				continue
			}
			if !t1.Before(from) && t1.Before(to) {
				_ = goodHist.RecordValue(max(t1.Sub(t0).Microseconds(), 1))
			}
		}
	})
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ph.seconds += o.phase.Seconds()
	ph.good.Merge(goodHist)
	for _, h := range readHists {
		ph.read.Merge(h)
	}
	ph.Errors += errCount.Load()
	ph.Listed += listed.Load()
	if ph.ErrorSample == "" {
		ph.ErrorSample = sample
	}
	p99 := float64(goodHist.ValueAtQuantile(99)) / 1000
	ph.RoundP99 = append(ph.RoundP99, p99)
	return p99, nil
}

// writeList prints the report as JSON or as a table.
func writeList(w io.Writer, r *listReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	fmt.Fprintf(w, "workload    %s: %d locks held (setup %.1fs); %d readers at %.0f ListLocks/s each, page_size %d; %d rounds of 2 × %.1fs\n",
		r.Workload, r.Locks, r.SetupSeconds, r.Readers, r.ReaderRate, r.PageSize, r.Rounds, r.PhaseSeconds)
	for _, ph := range []struct {
		name string
		p    *listPhase
	}{{"match", &r.Match}, {"none", &r.None}, {"idle", &r.Idle}} {
		p := ph.p
		fmt.Fprintf(w, "%-6s      prefix %q: good pair p50 %.2f ms p99 %.2f ms max %.2f ms (%d pairs, %.0f/s); reader call p50 %.2f ms p99 %.2f ms (%.0f/s each); errors %d %s\n",
			ph.name, p.Prefix, p.Good.P50, p.Good.P99, p.Good.Max, p.Good.Count, p.GoodPerSecond, p.Reader.P50, p.Reader.P99, p.ReaderPerSecond, p.Errors, p.ErrorSample)
	}
	fmt.Fprintf(w, "ratio       good p99 match/none %.2f× (per round:", r.P99Ratio)
	for _, x := range r.RoundRatios {
		fmt.Fprintf(w, " %.2f×", x)
	}
	_, err := fmt.Fprintln(w, ")")
	return err
}
