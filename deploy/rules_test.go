package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	rulesFile     = "prometheus/lockd-alerts.yml"
	dashboardFile = "grafana/lockd-dashboard.json"
)

// wantAlerts are the alerts the issue asks for; the file may have more.
var wantAlerts = []string{"LockdSessionExpiredWhileHolding", "LockdNoLeader", "LockdCommitLatencyHigh", "LockdWatchdogTrip", "LockdLimitHits"}

// TestAlertRulesParse: the rules file parses and validates with
// Prometheus's own rule parser (promtool check rules does the same) and has
// every alert the runbook names.
func TestAlertRulesParse(t *testing.T) {
	groups := parseRules(t)
	have := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			have[r.Alert] = true
		}
	}
	for _, a := range wantAlerts {
		if !have[a] {
			t.Errorf("alert %s missing from %s", a, rulesFile)
		}
	}
}

// TestMetricsNamedExist: every metric named by an alert rule or a Grafana
// panel exists on the /metrics of a lockd built from this tree and started
// here (a one-node cluster on free ports, after one Status call).
func TestMetricsNamedExist(t *testing.T) {
	exported := lockdMetrics(t)
	named := map[string][]string{} // metric -> where
	for _, g := range parseRules(t).Groups {
		for _, r := range g.Rules {
			for _, m := range metricNames(t, r.Expr) {
				named[m] = append(named[m], "alert "+r.Alert)
			}
		}
	}
	for _, p := range dashboardExprs(t) {
		for _, m := range metricNames(t, p.expr) {
			named[m] = append(named[m], "panel "+p.panel)
		}
	}
	if len(named) == 0 {
		t.Fatal("no metric names found in the rules and the dashboard")
	}
	var names []string
	for m := range named {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		if !exported[m] {
			t.Errorf("%s (used by %s) is not on lockd's /metrics", m, strings.Join(named[m], ", "))
		}
	}
	if !t.Failed() {
		t.Logf("%d metrics named by the rules and the dashboard, all exported", len(names))
	}
}

func parseRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return groups
}

// panelExpr is one Grafana target's query.
type panelExpr struct{ panel, expr string }

// dashboardExprs reads the targets of every panel of the dashboard.
func dashboardExprs(t *testing.T) []panelExpr {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []panelExpr
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, panelExpr{p.Title, tg.Expr})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no queries", dashboardFile)
	}
	return out
}

// grafanaVars stand in for Grafana's variables so that PromQL parses.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$job", "lockd")

// metricNames parses a PromQL expression and returns the metric names of
// its selectors.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		t.Errorf("parse %q: %v", expr, err)
		return nil
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				t.Errorf("%q: a selector without a metric name", expr)
			}
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

// lockdMetrics builds lockd from the parent module, runs a one-node
// cluster, makes one API call (so per-request series exist) and returns
// the names on /metrics (a histogram's _bucket, _sum and _count too).
func lockdMetrics(t *testing.T) map[string]bool {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not on PATH: cannot build lockd")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "lockd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/lockd")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build lockd: %v\n%s", err, out)
	}
	api, raft := freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", api, "--raft-listen", raft, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	url := "http://" + api
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("lockd at %s not ready after 30s (last error: %v)", url, err)
		}
		time.Sleep(50 * time.Millisecond) // polling a real process
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/lockd.v1.LockService/Status", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	names := map[string]bool{}
	for name, f := range fams {
		names[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		}
	}
	return names
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr())
}
