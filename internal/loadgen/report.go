package loadgen

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Report is the result of one run, the JSON of `lockd bench --json` and of
// the comparison harness. Counts and rates are over the measured window
// unless a field says otherwise; -1 means unknown.
type Report struct {
	// System is the service measured: "lockd", "redis", "etcd", "zookeeper".
	System string `json:"system"`
	// Version is the client's version, when known.
	Version string `json:"version,omitempty"`
	// Endpoints are the servers the clients were given.
	Endpoints []string `json:"endpoints,omitempty"`
	// Workload is Own, One, Handoff or Sessions.
	Workload string `json:"workload"`
	// Op says what one operation is for this workload.
	Op string `json:"op"`
	// Clients is the number of workers, each with its own client.
	Clients int `json:"clients"`
	// TTLSeconds is the sessions' lease TTL.
	TTLSeconds float64 `json:"ttl_seconds"`
	// WarmupSeconds is the unmeasured warm-up before the window.
	WarmupSeconds float64 `json:"warmup_seconds"`
	// Seconds is the length of the window as run (shorter than asked when
	// every worker reached its op limit early).
	Seconds float64 `json:"seconds"`
	// Ops is the number of operations that ended in the window (Sessions:
	// sessions created over the whole run).
	Ops int64 `json:"ops"`
	// OpsPerSecond is Ops over Seconds (Sessions: over the creation time).
	OpsPerSecond float64 `json:"ops_per_second"`
	// LatencyMicros summarizes the ops' latencies in microseconds.
	LatencyMicros Latency `json:"latency_us"`
	// Errors counts failed calls by kind over the whole run, warm-up
	// included; calls cut short by the run's end are not errors.
	Errors map[string]int64 `json:"errors"`
	// ErrorSamples holds the first message of each kind in Errors.
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	// ErrorCount is the sum of Errors.
	ErrorCount int64 `json:"error_count"`
	// PerWorkerOps is each worker's Ops (One and Handoff).
	PerWorkerOps []int64 `json:"per_worker_ops,omitempty"`
	// Fairness is the fewest ops of a worker over the most (One and
	// Handoff): 1 when every worker got the lock equally often.
	Fairness *float64 `json:"fairness,omitempty"`
	// ConnsOpened is the number of connections the clients dialled in the
	// window: near zero when connections are reused.
	ConnsOpened int64 `json:"connections_opened"`
	// ConnsPerSecond is ConnsOpened over Seconds.
	ConnsPerSecond float64 `json:"connections_per_second"`
	// ConnsTotal is every connection dialled, setup and warm-up included.
	ConnsTotal int64 `json:"connections_total"`
	// ClientCPUSeconds is the CPU time (user+system) of the whole bench
	// process in the window: every client's share of the cost.
	ClientCPUSeconds float64 `json:"client_cpu_seconds"`
	// ClientCPUPercent is ClientCPUSeconds over Seconds, in percent of one
	// core.
	ClientCPUPercent float64 `json:"client_cpu_percent"`
	// ClientCPUMicrosPerOp is ClientCPUSeconds per op (not for Sessions).
	ClientCPUMicrosPerOp float64 `json:"client_cpu_us_per_op,omitempty"`
	// ClientMaxRSSBytes is the bench process's peak resident memory.
	ClientMaxRSSBytes int64 `json:"client_max_rss_bytes"`
	// Sessions details the Sessions workload.
	Sessions *SessionStats `json:"sessions,omitempty"`
	// Started is when the run began (warm-up included).
	Started time.Time `json:"started"`
}

// Latency is a latency distribution in microseconds.
type Latency struct {
	// Count is the number of values.
	Count int64 `json:"count"`
	// P50 is the median.
	P50 int64 `json:"p50"`
	// P90 is the 90th percentile.
	P90 int64 `json:"p90"`
	// P99 is the 99th percentile.
	P99 int64 `json:"p99"`
	// Max is the largest value.
	Max int64 `json:"max"`
	// Mean is the average.
	Mean float64 `json:"mean"`
}

// SessionStats is the outcome of the Sessions workload.
type SessionStats struct {
	// Requested is the number of sessions asked for.
	Requested int `json:"requested"`
	// Created is the number created before the run ended.
	Created int64 `json:"created"`
	// CreateErrors counts creations that failed.
	CreateErrors int64 `json:"create_errors"`
	// CreateSeconds is the time from the start to the last creation.
	CreateSeconds float64 `json:"create_seconds"`
	// Lost counts created sessions whose lease was lost before the end:
	// the keepalive failures the client could not recover from.
	Lost int64 `json:"lost"`
}

// opNames says what an op is, per workload.
var opNames = map[string]string{
	Own:      "acquire+release pair",
	One:      "grant of the shared lock",
	Handoff:  "grant to a waiter, timed from the release call",
	Sessions: "session created",
}

func latencyOf(h *hdrhistogram.Histogram) Latency {
	if h.TotalCount() == 0 {
		return Latency{}
	}
	return Latency{
		Count: h.TotalCount(),
		P50:   h.ValueAtQuantile(50),
		P90:   h.ValueAtQuantile(90),
		P99:   h.ValueAtQuantile(99),
		Max:   h.Max(),
		Mean:  h.Mean(),
	}
}

func newReport(d Driver, cfg Config, recs []*recorder, m measurement, conns0 int64) *Report {
	r := &Report{
		System:        d.System(),
		Workload:      cfg.Workload,
		Op:            opNames[cfg.Workload],
		Clients:       cfg.Clients,
		TTLSeconds:    cfg.TTL.Seconds(),
		WarmupSeconds: cfg.Warmup.Seconds(),
		Seconds:       m.seconds(),
		Errors:        map[string]int64{},
		ErrorSamples:  map[string]string{},
		ConnsOpened:   -1,
		ConnsTotal:    -1,
		Started:       m.from.Add(-cfg.Warmup),
	}
	all := newHistogram()
	for _, rec := range recs {
		all.Merge(rec.hist)
		r.Ops += rec.ops
		r.PerWorkerOps = append(r.PerWorkerOps, rec.ops)
		for k, n := range rec.errs {
			r.Errors[k] += n
			r.ErrorCount += n
			if _, ok := r.ErrorSamples[k]; !ok {
				r.ErrorSamples[k] = rec.samples[k]
			}
		}
	}
	r.LatencyMicros = latencyOf(all)
	if s := r.Seconds; s > 0 {
		r.OpsPerSecond = float64(r.Ops) / s
	}
	if cfg.Workload == One || cfg.Workload == Handoff {
		lo, hi := slices.Min(r.PerWorkerOps), slices.Max(r.PerWorkerOps)
		f := 0.0
		if hi > 0 {
			f = float64(lo) / float64(hi)
		}
		r.Fairness = &f
	} else {
		r.PerWorkerOps = nil
	}
	if m.conns0 >= 0 && m.conns1 >= 0 {
		r.ConnsOpened = m.conns1 - m.conns0
		r.ConnsTotal = m.conns1 - conns0
		if s := r.Seconds; s > 0 {
			r.ConnsPerSecond = float64(r.ConnsOpened) / s
		}
	}
	r.ClientMaxRSSBytes = m.maxRSS
	r.ClientCPUSeconds = -1
	if m.cpu0 >= 0 && m.cpu1 >= 0 {
		cpu := m.cpu1 - m.cpu0
		r.ClientCPUSeconds = cpu.Seconds()
		if s := r.Seconds; s > 0 {
			r.ClientCPUPercent = 100 * cpu.Seconds() / s
		}
		if r.Ops > 0 && cfg.Workload != Sessions {
			r.ClientCPUMicrosPerOp = float64(cpu.Microseconds()) / float64(r.Ops)
		}
	}
	return r
}

// WriteTable writes r for people.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "system\t%s %s\n", r.System, r.Version)
	if len(r.Endpoints) > 0 {
		fmt.Fprintf(tw, "endpoints\t%s\n", strings.Join(r.Endpoints, ","))
	}
	fmt.Fprintf(tw, "workload\t%s (op: %s), %d clients, ttl %s\n", r.Workload, r.Op, r.Clients, secs(r.TTLSeconds))
	fmt.Fprintf(tw, "window\t%s after %s warm-up\n", secs(r.Seconds), secs(r.WarmupSeconds))
	if s := r.Sessions; s != nil {
		fmt.Fprintf(tw, "sessions\t%d of %d created in %s (%.0f/s), %d creation errors, %d lost\n",
			s.Created, s.Requested, secs(s.CreateSeconds), r.OpsPerSecond, s.CreateErrors, s.Lost)
	} else {
		fmt.Fprintf(tw, "ops\t%d (%.1f/s)\n", r.Ops, r.OpsPerSecond)
	}
	l := r.LatencyMicros
	fmt.Fprintf(tw, "latency\tp50 %s  p90 %s  p99 %s  max %s  (n=%d)\n", ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max), l.Count)
	if r.Fairness != nil {
		fmt.Fprintf(tw, "fairness\t%.2f (min/max ops per worker: %d/%d)\n", *r.Fairness, slices.Min(r.PerWorkerOps), slices.Max(r.PerWorkerOps))
	}
	fmt.Fprintf(tw, "errors\t%s\n", errorList(r.Errors))
	for _, k := range slices.Sorted(maps.Keys(r.ErrorSamples)) {
		fmt.Fprintf(tw, "  first %s\t%s\n", k, r.ErrorSamples[k])
	}
	if r.ConnsOpened >= 0 {
		fmt.Fprintf(tw, "connections\t%d opened in the window (%.1f/s), %d in all\n", r.ConnsOpened, r.ConnsPerSecond, r.ConnsTotal)
	} else {
		fmt.Fprintf(tw, "connections\tnot counted\n")
	}
	if r.ClientCPUSeconds >= 0 {
		perOp := ""
		if r.ClientCPUMicrosPerOp > 0 {
			perOp = fmt.Sprintf(", %.0f µs/op", r.ClientCPUMicrosPerOp)
		}
		fmt.Fprintf(tw, "client cpu\t%.2f s (%.0f %% of a core%s), max rss %d MiB\n", r.ClientCPUSeconds, r.ClientCPUPercent, perOp, r.ClientMaxRSSBytes>>20)
	}
	return tw.Flush()
}

func errorList(errs map[string]int64) string {
	if len(errs) == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, errs[k]))
	}
	return strings.Join(parts, ", ")
}

// ms formats microseconds as milliseconds for the table.
func ms(us int64) string {
	return fmt.Sprintf("%.2fms", float64(us)/1000)
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}
