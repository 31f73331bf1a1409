package loadgen

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	good := Config{Workload: Own, Clients: 1, Duration: time.Second, TTL: time.Second, MaxOps: 1, OpTimeout: time.Second}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"workload", func(c *Config) { c.Workload = "x" }, "unknown workload"},
		{"clients", func(c *Config) { c.Clients = 0 }, "clients"},
		{"one alone", func(c *Config) { c.Workload = One }, "at least 2"},
		{"handoff alone", func(c *Config) { c.Workload = Handoff }, "at least 2"},
		{"duration", func(c *Config) { c.Duration = 0 }, "duration"},
		{"warmup", func(c *Config) { c.Warmup = -1 }, "warmup"},
		{"ttl", func(c *Config) { c.TTL = 0 }, "ttl"},
		{"sessions", func(c *Config) { c.Workload = Sessions }, "sessions"},
		{"max ops", func(c *Config) { c.MaxOps = 0 }, "max ops"},
		{"timeout", func(c *Config) { c.OpTimeout = 0 }, "op timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error about %q", err, tt.want)
			}
		})
	}
}

// nullDriver only names itself and counts nothing; newReport needs no more.
type nullDriver struct{ conns int64 }

func (nullDriver) System() string                            { return "null" }
func (nullDriver) NewClient(context.Context) (Client, error) { return nil, errors.ErrUnsupported }
func (nullDriver) ErrorKind(error) string                    { return "other" }
func (d nullDriver) ConnsOpened() int64                      { return d.conns }

func TestReport(t *testing.T) {
	base := time.Now()
	w := window{start: base, from: base.Add(time.Second), to: base.Add(3 * time.Second)}
	cfg := Config{Workload: One, Clients: 2, Duration: 2 * time.Second, Warmup: time.Second, TTL: time.Second}
	a, b := newRecorder(w), newRecorder(w)
	a.op(base, base.Add(500*time.Millisecond)) // in the warm-up: not counted
	a.op(base, base.Add(3*time.Second))        // at the end: not counted
	a.fail("timeout", errors.New("slow"))      // errors count anywhere
	for i := range 10 {                        // a: 10 ops of 1..10 ms
		end := w.from.Add(time.Duration(i+1) * 100 * time.Millisecond)
		a.op(end.Add(-time.Duration(i+1)*time.Millisecond), end)
	}
	for range 5 { // b: 5 ops of 20 ms
		end := w.from.Add(time.Second)
		b.op(end.Add(-20*time.Millisecond), end)
	}
	m := measurement{from: w.from, to: w.to, conns0: 4, conns1: 5, cpu0: time.Second, cpu1: 2 * time.Second, maxRSS: 1 << 20}
	r := newReport(nullDriver{}, cfg, []*recorder{a, b}, m, 0)

	if r.Ops != 15 || r.OpsPerSecond != 7.5 {
		t.Errorf("ops: got %d (%v/s), want 15 (7.5/s)", r.Ops, r.OpsPerSecond)
	}
	if r.Fairness == nil || *r.Fairness != 0.5 {
		t.Errorf("fairness: got %v, want 0.5 (5 of 10)", r.Fairness)
	}
	l := r.LatencyMicros
	if l.Count != 15 || l.P50 < 8_000 || l.P50 > 8_010 || l.Max < 20_000 || l.Max > 20_020 {
		t.Errorf("latency: got %+v, want 15 values, p50 8 ms (the 8th of 15), max about 20 ms", l)
	}
	if r.ErrorCount != 1 || r.Errors["timeout"] != 1 || r.ErrorSamples["timeout"] != "slow" {
		t.Errorf("errors: got %d %v %v, want one timeout (slow)", r.ErrorCount, r.Errors, r.ErrorSamples)
	}
	if r.ConnsOpened != 1 || r.ConnsTotal != 5 || r.ConnsPerSecond != 0.5 {
		t.Errorf("connections: got %d (%v/s), %d in all, want 1 (0.5/s), 5", r.ConnsOpened, r.ConnsPerSecond, r.ConnsTotal)
	}
	if r.ClientCPUSeconds != 1 || r.ClientCPUPercent != 50 {
		t.Errorf("cpu: got %vs (%v %%), want 1 s (50 %%)", r.ClientCPUSeconds, r.ClientCPUPercent)
	}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"0.50 (min/max ops per worker: 5/10)", "timeout 1", "slow", "1 opened in the window"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, sb.String())
		}
	}
}
