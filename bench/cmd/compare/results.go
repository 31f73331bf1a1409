package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/lockd-dev/lockd/internal/loadgen"
)

// A result file is DIR/p<pass>_<system>_<nodes>_<workload>.json, as
// bench/run.sh names them.
type resultKey struct {
	system   string
	nodes    int
	workload string
}

type results map[resultKey]map[int]*loadgen.Report // by pass

func readResults(dir string) (results, []int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "p*_*_*_*.json"))
	if err != nil {
		return nil, nil, err
	}
	res := results{}
	var passes []int
	for _, f := range files {
		parts := strings.Split(strings.TrimSuffix(filepath.Base(f), ".json"), "_")
		if len(parts) != 4 {
			continue
		}
		pass, err1 := strconv.Atoi(strings.TrimPrefix(parts[0], "p"))
		nodes, err2 := strconv.Atoi(parts[2])
		if err1 != nil || err2 != nil {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		var r loadgen.Report
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", f, err)
		}
		k := resultKey{system: parts[1], nodes: nodes, workload: parts[3]}
		if res[k] == nil {
			res[k] = map[int]*loadgen.Report{}
		}
		res[k][pass] = &r
		if !slices.Contains(passes, pass) {
			passes = append(passes, pass)
		}
	}
	slices.Sort(passes)
	return res, passes, nil
}

// rows is the order of the systems in the tables.
var rows = []struct {
	system string
	nodes  int
	label  string
}{
	{"lockd", 1, "lockd, 1 node"},
	{"redis", 1, "Redis, AOF appendfsync always"},
	{"etcd", 1, "etcd, 1 member"},
	{"zookeeper", 1, "ZooKeeper, 1 server"},
	{"lockd", 3, "lockd, 3 nodes"},
	{"etcd", 3, "etcd, 3 members"},
	{"zookeeper", 3, "ZooKeeper, 3 servers"},
}

// writeResults writes the markdown tables of the reports in dir.
func writeResults(w io.Writer, dir string) error {
	res, passes, err := readResults(dir)
	if err != nil {
		return err
	}
	if len(res) == 0 {
		return fmt.Errorf("no result files in %s", dir)
	}
	rate := func(system string, nodes int, workload string) []float64 {
		var v []float64
		for _, p := range passes {
			if r := res[resultKey{system, nodes, workload}][p]; r != nil {
				v = append(v, r.OpsPerSecond)
			} else {
				v = append(v, -1)
			}
		}
		return v
	}

	fmt.Fprintf(w, "### Summary (range over %d passes)\n\n", len(passes))
	fmt.Fprintln(w, "| system | (a) own locks, acquire+release pairs/s | (b) one lock, handoffs/s | (b) fairness min/max |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	for _, row := range rows {
		fair := fairness(res[resultKey{row.system, row.nodes, loadgen.One}], passes)
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", row.label,
			span(rate(row.system, row.nodes, loadgen.Own), "k"), span(rate(row.system, row.nodes, loadgen.One), "k"), span(fair, ""))
	}

	fmt.Fprint(w, "\n### Ratios against the performance targets\n\n")
	fmt.Fprint(w, "Each ratio is lockd's rate over the anchor's in the same pass; the range spans the passes.\n\n")
	fmt.Fprintln(w, "| | lockd | anchor | ratio | goal | met |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---|")
	ratios := []struct {
		label    string
		workload string
		nodes    int
		anchor   string
		goal     float64
	}{
		{"(a) own locks, 1 node, vs Redis AOF always", loadgen.Own, 1, "redis", 1},
		{"(a) own locks, 1 node, vs ZooKeeper 1", loadgen.Own, 1, "zookeeper", 2},
		{"(a) own locks, 1 node, vs etcd 1", loadgen.Own, 1, "etcd", 3},
		{"(a) own locks, 3 nodes, vs etcd 3", loadgen.Own, 3, "etcd", 3},
		{"(a) own locks, 3 nodes, vs ZooKeeper 3", loadgen.Own, 3, "zookeeper", 3},
		{"(b) one lock, 1 node, vs Redis AOF always", loadgen.One, 1, "redis", 1.5},
		{"(b) one lock, 1 node, vs etcd 1", loadgen.One, 1, "etcd", 5},
		{"(b) one lock, 1 node, vs ZooKeeper 1", loadgen.One, 1, "zookeeper", 3},
		{"(b) one lock, 3 nodes, vs etcd 3", loadgen.One, 3, "etcd", 5},
		{"(b) one lock, 3 nodes, vs ZooKeeper 3", loadgen.One, 3, "zookeeper", 3},
	}
	for _, q := range ratios {
		a, b := rate("lockd", q.nodes, q.workload), rate(q.anchor, q.nodes, q.workload)
		var rs []float64
		for i := range a {
			if a[i] >= 0 && b[i] > 0 {
				rs = append(rs, a[i]/b[i])
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | ≥ %g× | %s |\n", q.label, span(a, "k"), span(b, "k"), span(rs, "×"), q.goal, met(rs, q.goal))
	}
	for _, n := range []int{1, 3} {
		fair := fairness(res[resultKey{"lockd", n, loadgen.One}], passes)
		fmt.Fprintf(w, "| (b) fairness, lockd %d node(s) | %s | | | ≥ 0.9 | %s |\n", n, span(fair, ""), met(fair, 0.9))
	}

	writeHandoffs(w, res, passes)

	if err := writeSessions(w, dir, res, passes); err != nil {
		return err
	}

	fmt.Fprint(w, "\n### Every run\n\n")
	fmt.Fprintln(w, "| pass | system | nodes | workload | ops/s | p50 ms | p90 ms | p99 ms | max ms | fairness | errors | conns opened (window / all) | client CPU µs/op |")
	fmt.Fprintln(w, "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
	for _, p := range passes {
		for _, row := range rows {
			for _, wl := range []string{loadgen.Own, loadgen.One, loadgen.Handoff} {
				r := res[resultKey{row.system, row.nodes, wl}][p]
				if r == nil {
					continue
				}
				l := r.LatencyMicros
				f := "—"
				if r.Fairness != nil {
					f = fmt.Sprintf("%.2f", *r.Fairness)
				}
				errs := "0"
				if r.ErrorCount > 0 {
					var parts []string
					for k, n := range r.Errors {
						parts = append(parts, fmt.Sprintf("%s %d", k, n))
					}
					slices.Sort(parts)
					errs = strings.Join(parts, ", ")
				}
				fmt.Fprintf(w, "| %d | %s | %d | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %s | %s | %d / %d | %.0f |\n",
					p, row.system, row.nodes, wl, r.OpsPerSecond, msf(l.P50), msf(l.P90), msf(l.P99), msf(l.Max),
					f, errs, r.ConnsOpened, r.ConnsTotal, r.ClientCPUMicrosPerOp)
			}
		}
	}
	return nil
}

func msf(us int64) float64 { return float64(us) / 1000 }

func fairness(byPass map[int]*loadgen.Report, passes []int) []float64 {
	var v []float64
	for _, p := range passes {
		if r := byPass[p]; r != nil && r.Fairness != nil {
			v = append(v, *r.Fairness)
		}
	}
	return v
}

// span formats the range of the known values (negative ones are missing
// runs): "1.95k–2.84k", "0.33–0.41×", or "—".
func span(v []float64, unit string) string {
	var known []float64
	for _, x := range v {
		if x >= 0 {
			known = append(known, x)
		}
	}
	if len(known) == 0 {
		return "—"
	}
	lo, hi := slices.Min(known), slices.Max(known)
	f := func(x float64) string {
		switch unit {
		case "k":
			return fmt.Sprintf("%.2fk", x/1000)
		case "×":
			return ratio(x) + "×"
		}
		return fmt.Sprintf("%.2f", x)
	}
	if f(lo) == f(hi) {
		return f(lo)
	}
	return f(lo) + "–" + f(hi)
}

// met says whether every pass reached the goal.
func met(v []float64, goal float64) string {
	switch {
	case len(v) == 0:
		return "not measured"
	case slices.Min(v) >= goal:
		return "yes"
	case slices.Max(v) >= goal:
		return "in some passes"
	}
	return "no (best " + ratio(slices.Max(v)) + ")"
}

// ratio prints a ratio to two places, rounded down, so one just under a
// target never prints as meeting it (1.496 is 1.49, not 1.50).
func ratio(x float64) string {
	return fmt.Sprintf("%.2f", math.Floor(x*100)/100)
}

// serverStats is what run.sh read from /proc about the servers during
// workload (d): DIR/server_p<pass>_<system>_1_sessions.json.
type serverStats struct {
	CPUPercent  float64 `json:"server_cpu_percent"`
	MaxRSSBytes int64   `json:"server_max_rss_bytes"`
}

// writeSessions writes the table of workload (d), if it was run.
func writeSessions(w io.Writer, dir string, res results, passes []int) error {
	header := false
	for _, p := range passes {
		for _, system := range []string{"lockd", "etcd"} {
			r := res[resultKey{system, 1, loadgen.Sessions}][p]
			if r == nil || r.Sessions == nil {
				continue
			}
			var st serverStats
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("server_p%d_%s_1_sessions.json", p, system)))
			if err != nil {
				return err
			}
			if err := json.Unmarshal(b, &st); err != nil {
				return fmt.Errorf("server stats of %s: %w", system, err)
			}
			if !header {
				header = true
				fmt.Fprintf(w, "\n### (d) Sessions kept alive, one node, TTL %gs\n\n", r.TTLSeconds)
				fmt.Fprintln(w, "| pass | system | created / asked | creation errors | lost | created/s | creation p99 ms | server CPU, % of a core | server peak RSS MiB | client CPU, % of a core | conns opened (window) |")
				fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
			}
			ss := r.Sessions
			fmt.Fprintf(w, "| %d | %s | %d / %d | %d | %d | %.0f | %.2f | %.1f | %d | %.1f | %d |\n",
				p, system, ss.Created, ss.Requested, ss.CreateErrors, ss.Lost, r.OpsPerSecond, msf(r.LatencyMicros.P99),
				st.CPUPercent, st.MaxRSSBytes>>20, r.ClientCPUPercent, r.ConnsOpened)
		}
	}
	return nil
}

// writeHandoffs writes the table of workload (c), if it was run: the
// latency of a handoff, from the holder's release call to the grant of a
// worker already waiting, and whether lockd's p99 was the lowest of the
// systems with as many nodes in every pass.
func writeHandoffs(w io.Writer, res results, passes []int) {
	lat := func(system string, nodes int, p int) (p50, p99 float64, ok bool) {
		r := res[resultKey{system, nodes, loadgen.Handoff}][p]
		if r == nil || r.OpsPerSecond <= 0 || r.ErrorCount > 0 {
			return 0, 0, false
		}
		return msf(r.LatencyMicros.P50), msf(r.LatencyMicros.P99), true
	}
	header := false
	for _, row := range rows {
		var p50s, p99s, rates []float64
		for _, p := range passes {
			if a, b, ok := lat(row.system, row.nodes, p); ok {
				p50s, p99s = append(p50s, a), append(p99s, b)
				rates = append(rates, res[resultKey{row.system, row.nodes, loadgen.Handoff}][p].OpsPerSecond)
			}
		}
		if len(p50s) == 0 {
			continue
		}
		if !header {
			header = true
			fmt.Fprintf(w, "\n### (c) Handoff latency (range over %d passes)\n\n", len(passes))
			fmt.Fprintln(w, "From the holder's release call to the grant of a worker already waiting, on one lock all workers share.")
			fmt.Fprintln(w)
			fmt.Fprintln(w, "| system | handoffs/s | p50 ms | p99 ms |")
			fmt.Fprintln(w, "|---|---:|---:|---:|")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", row.label, span(rates, "k"), span(p50s, ""), span(p99s, ""))
	}
	if !header {
		return
	}
	fmt.Fprintln(w)
	for _, n := range []int{1, 3} {
		if line := lowestP99(n, passes, lat); line != "" {
			fmt.Fprintln(w, line)
		}
	}
}

// lowestP99 says in how many passes lockd with n nodes had the lowest
// handoff p99 of the systems with n nodes. A pass counts only when lockd
// and every other such system have a clean result in it (lat reports
// none for a run with errors): a system that was not measured is not
// beaten.
func lowestP99(n int, passes []int, lat func(system string, nodes, pass int) (p50, p99 float64, ok bool)) string {
	lowest, compared, skipped := 0, 0, 0
	for _, p := range passes {
		_, mine, ok := lat("lockd", n, p)
		if !ok {
			continue // lockd not measured in this pass: nothing to compare
		}
		best, others := true, 0
		for _, row := range rows {
			if row.nodes != n || row.system == "lockd" {
				continue
			}
			_, theirs, ok := lat(row.system, row.nodes, p)
			if !ok {
				others = 0 // a system without a clean result: no verdict
				break
			}
			others++
			best = best && mine < theirs
		}
		if others == 0 {
			skipped++
			continue
		}
		compared++
		if best {
			lowest++
		}
	}
	if compared == 0 {
		if skipped > 0 {
			return fmt.Sprintf("lockd %d node(s): p99 not compared (no pass has a clean result of every system with as many nodes).", n)
		}
		return ""
	}
	line := fmt.Sprintf("lockd %d node(s): p99 the lowest of the systems with as many nodes in %d of %d passes", n, lowest, compared)
	if skipped > 0 {
		line += fmt.Sprintf(" (%d more not compared: a system without a clean result)", skipped)
	}
	return line + "."
}
