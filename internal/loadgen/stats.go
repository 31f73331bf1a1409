package loadgen

import (
	"context"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram range: 1 µs to 60 s at 3 significant digits (0.1 % error).
// Slower calls are recorded as 60 s; every call is bounded by OpTimeout.
const (
	histMinMicros = 1
	histMaxMicros = 60_000_000
	histSigFigs   = 3
)

func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(histMinMicros, histMaxMicros, histSigFigs)
}

// window is the measured part of a run: [from, to), after the warm-up.
type window struct {
	start, from, to time.Time
}

func newWindow(cfg Config) window {
	now := time.Now()
	from := now.Add(cfg.Warmup)
	return window{start: now, from: from, to: from.Add(cfg.Duration)}
}

// recorder holds one worker's counts. Only its worker writes it; the run
// reads it after the worker has returned.
type recorder struct {
	from, to time.Time
	hist     *hdrhistogram.Histogram
	ops      int64
	errs     map[string]int64
	samples  map[string]string // the first message of each error kind
}

func newRecorder(w window) *recorder {
	return &recorder{from: w.from, to: w.to, hist: newHistogram(), errs: map[string]int64{}, samples: map[string]string{}}
}

// op records an operation from start to end if it ended inside the window.
func (r *recorder) op(start, end time.Time) {
	if end.Before(r.from) || !end.Before(r.to) {
		return
	}
	r.ops++
	us := end.Sub(start).Microseconds()
	_ = r.hist.RecordValue(min(max(us, histMinMicros), histMaxMicros))
}

// fail counts an error of the given kind, in the window or not: an error
// during the warm-up is as much a finding as one after it.
func (r *recorder) fail(kind string, err error) {
	if r.errs[kind] == 0 {
		r.samples[kind] = err.Error()
	}
	r.errs[kind]++
}

// measurement is what the run saw of the process around the window.
type measurement struct {
	from, to       time.Time // the window as run: to is earlier when every worker stopped early
	conns0, conns1 int64     // connections dialled at from and at to; -1 unknown
	cpu0, cpu1     time.Duration
	maxRSS         int64 // bytes; -1 unknown
}

// measure samples connections and CPU when the window opens and when it
// closes (at its end, or when every worker in wg has returned), then waits
// for the workers.
func (w window) measure(run context.Context, d Driver, wg *sync.WaitGroup) measurement {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(w.from))
	defer t.Stop()
	select {
	case <-t.C:
	case <-done:
	case <-run.Done():
	}
	m := measurement{from: w.from, conns0: d.ConnsOpened(), cpu0: CPUTime()}
	select {
	case <-done:
	case <-run.Done():
	}
	m.to = time.Now()
	if m.to.After(w.to) {
		m.to = w.to
	}
	if m.to.Before(m.from) {
		m.to = m.from
	}
	m.conns1, m.cpu1, m.maxRSS = d.ConnsOpened(), CPUTime(), maxRSS()
	<-done
	return m
}

func (m measurement) seconds() float64 { return m.to.Sub(m.from).Seconds() }
