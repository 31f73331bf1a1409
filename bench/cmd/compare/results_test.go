package main

import (
	"strings"
	"testing"
)

// TestLowestP99 checks the handoff verdict: a pass counts only when lockd
// and every other system with as many nodes have a clean result in it,
// and a tie is not the lowest.
func TestLowestP99(t *testing.T) {
	type key struct {
		system string
		pass   int
	}
	cases := []struct {
		name string
		p99  map[key]float64 // one node; absent: no clean result
		want string
	}{
		{"lockd alone", map[key]float64{{"lockd", 1}: 0.5, {"lockd", 2}: 0.5},
			"not compared"},
		{"lowest in both", map[key]float64{
			{"lockd", 1}: 0.5, {"redis", 1}: 1.2, {"etcd", 1}: 50, {"zookeeper", 1}: 1.0,
			{"lockd", 2}: 0.5, {"redis", 2}: 1.3, {"etcd", 2}: 55, {"zookeeper", 2}: 1.1},
			"in 2 of 2 passes."},
		{"a competitor missing from one pass", map[key]float64{
			{"lockd", 1}: 0.5, {"redis", 1}: 1.2, {"etcd", 1}: 50, {"zookeeper", 1}: 1.0,
			{"lockd", 2}: 0.5, {"redis", 2}: 1.3, {"etcd", 2}: 55},
			"in 1 of 1 passes (1 more not compared"},
		{"a tie is not the lowest", map[key]float64{
			{"lockd", 1}: 1.0, {"redis", 1}: 1.2, {"etcd", 1}: 50, {"zookeeper", 1}: 1.0,
			{"lockd", 2}: 0.9, {"redis", 2}: 1.3, {"etcd", 2}: 55, {"zookeeper", 2}: 1.1},
			"in 1 of 2 passes."},
	}
	for _, c := range cases {
		lat := func(system string, nodes, pass int) (float64, float64, bool) {
			v, ok := c.p99[key{system, pass}]
			return 0, v, ok && nodes == 1
		}
		got := lowestP99(1, []int{1, 2}, lat)
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: got %q, want it to contain %q", c.name, got, c.want)
		}
	}
	if got := lowestP99(3, []int{1, 2}, func(string, int, int) (float64, float64, bool) { return 0, 0, false }); got != "" {
		t.Errorf("three nodes never measured: got %q, want nothing", got)
	}
}

// Ratios print rounded down, in the ratio column and in a missed target's
// best, so a ratio just under a target never reads as meeting it.
func TestRatiosRoundDown(t *testing.T) {
	if got := span([]float64{1.496, 1.527}, "×"); got != "1.49×–1.52×" {
		t.Errorf("span: got %q, want 1.49×–1.52×", got)
	}
	if got := met([]float64{4.949, 4.1}, 5); got != "no (best 4.94)" {
		t.Errorf("met: got %q, want no (best 4.94)", got)
	}
}
