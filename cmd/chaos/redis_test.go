package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Each Redis backend under a short run (one Redis kill and one Redis
// pause): the tool starts its redis-server processes, the Go workers and
// `lockd run --backend redis://…` loops take locks and write to the
// register, and the report carries the rows (unsafe, unfenced and fenced
// overlaps, shared tokens, lost acks) whatever they measure: on Redis a
// violation is an outcome, and the run exits 0 (without --strict).
func TestRedisBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("real-process chaos run: skipped with -short")
	}
	if os.Getenv("LOCKD_STREAM") == "off" {
		// CI's second pass turns lockd's session stream off; nothing
		// here uses it, so the first pass has said all there is.
		t.Skip("the Redis backends do not use lockd's session stream")
	}
	for _, backend := range []string{backendRedis, backendRedisAOF, backendRedlock} {
		t.Run(backend, func(t *testing.T) {
			out := t.TempDir()
			cfg := &config{Seed: 7, Backend: backend, Profile: "short", Nodes: 3, Clients: 4, Locks: 2, Out: out,
				Faults: []string{faultRedisKill, faultRedisPause}}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, err := run(ctx, cfg, &syncWriter{t: t})
			if errors.Is(err, errNoRedis) && os.Getenv("CI") != "true" {
				t.Skipf("redis-server not installed: %v", err)
			}
			if err != nil && r == nil && strings.Contains(err.Error(), "go build") && os.Getenv("CI") != "true" {
				t.Skipf("cannot build lockd: %v", err)
			}
			if err != nil {
				t.Fatalf("chaos run: %v", err)
			}
			t.Log(summary(r))
			wantNodes := 1
			if backend == backendRedlock {
				wantNodes = 3
			}
			if r.Backend != backend || r.Nodes != wantNodes || r.Faults[faultRedisKill] != 1 || r.Faults[faultRedisPause] != 1 {
				t.Errorf("report: backend %q, %d servers, faults %v; want %s, %d, one kill and one pause", r.Backend, r.Nodes, r.Faults, backend, wantNodes)
			}
			if r.Ops.Acquired == 0 || r.Ops.Runs == 0 || r.Linear == "none" {
				t.Errorf("no load measured: operations %+v, linearizable %s", r.Ops, r.Linear)
			}
			if got := exitFor(cfg, r); got != exitOK {
				t.Errorf("exit %d on a Redis backend without --strict, want 0", got)
			}
			b, err := os.ReadFile(filepath.Join(out, "report.json"))
			if err != nil {
				t.Fatal(err)
			}
			var rows struct {
				Backend  string                     `json:"backend"`
				Overlaps map[string]int             `json:"overlaps"`
				Shared   *int                       `json:"sharedTokens"`
				LostAcks *int                       `json:"lostAcks"`
				Unavail  map[string]json.RawMessage `json:"unavailabilityMs"`
			}
			if err := json.Unmarshal(b, &rows); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"unsafe", "unfenced", "fenced"} {
				if _, ok := rows.Overlaps[k]; !ok {
					t.Errorf("report.json has no overlaps.%s: %s", k, b)
				}
			}
			if rows.Backend != backend || rows.Shared == nil || rows.LostAcks == nil || rows.Unavail[faultRedisKill] == nil {
				t.Errorf("report.json lacks a row: %s", b)
			}
		})
	}
}
