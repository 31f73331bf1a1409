// Command chaos attacks a real lockd cluster with faults and checks, from
// a fenced register the clients write to, that nothing unsafe happened.
//
// Run it from the module's root:
//
//	go run ./cmd/chaos --profile short --seed 1
//
// It builds ./cmd/lockd, starts a cluster of `lockd serve` processes on
// 127.0.0.1, Go-client workers (some of their holds sets of locks taken at
// once) and `lockd run` loops contending on a few locks, and lock-order
// inversion pairs whose cycles must be refused, injects faults on a seeded
// schedule, and checks the recorded history. Exit codes: 0 no violation, 1 violations found, 2 the harness
// failed, 64 usage. `chaos check FILE` re-checks a recorded history.
//
// With --backend redis, redis-aof or redlock it runs the same clients and
// checks against redis-server processes it starts, and reports what those
// backends do under Redis kills and pauses (exit 0 unless --strict: there
// violations are the measurement). See docs/chaos.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK        = 0
	exitViolation = 1
	exitHarness   = 2
	exitUsage     = 64
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Main runs the tool with args (without the program name) and returns the
// exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "worker":
			c, err := parseWorker(args[1:])
			if err == nil {
				err = runWorker(ctx, c)
			}
			return childExit(stderr, err)
		case "write":
			return childExit(stderr, runWrite(ctx, args[1:]))
		case "check":
			return checkFile(args[1:], stdout, stderr)
		}
	}
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "chaos:", err)
		}
		return exitUsage
	}
	r, err := run(ctx, cfg, stderr)
	if r != nil {
		fmt.Fprintln(stdout, summary(r))
	}
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return exitHarness
	}
	for _, v := range r.Violations {
		fmt.Fprintln(stderr, "violation:", v)
	}
	return exitFor(cfg, r)
}

// exitFor is the exit code of a finished run. On lockd a violation fails
// the run: lockd promises none. On a Redis backend the violations are the
// measurement (docs/backends.md's table says which faults break which
// backend), so the run exits 0 unless --strict.
func exitFor(cfg *config, r *Report) int {
	if len(r.Violations) > 0 && (!isRedis(cfg.Backend) || cfg.Strict) {
		return exitViolation
	}
	return exitOK
}

func childExit(stderr io.Writer, err error) int {
	switch {
	case err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return 0
	case errors.Is(err, errStale):
		return 3
	}
	fmt.Fprintln(stderr, "chaos:", err)
	return 1
}

// config is the tool's flags.
type config struct {
	Seed     uint64
	Profile  string
	Nodes    int
	Clients  int
	Locks    int
	Duration time.Duration
	Broken   string
	Out      string
	Keep     bool
	Backend  string
	Faults   []string
	Strict   bool
	Pairs    int
}

func parseConfig(args []string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of the fault schedule and the clients (default: from the clock; printed for replay)")
	fs.StringVar(&c.Profile, "profile", "short", "short: every fault kind once; long: random faults until --duration ends")
	fs.IntVar(&c.Nodes, "nodes", 3, "cluster size: 3 or 5")
	fs.IntVar(&c.Clients, "clients", 6, "client slots, half Go workers and half lockd run loops (at least 2)")
	fs.IntVar(&c.Locks, "locks", 2, "lock names the clients contend on")
	fs.IntVar(&c.Pairs, "pairs", 1, "lock-order inversion pairs on lockd (each one process with two sessions on two names of its own)")
	fs.DurationVar(&c.Duration, "duration", 0, "run length (default: as long as the short profile's faults take; 30m for long)")
	fs.StringVar(&c.Broken, "broken", "", "deliberate bug to prove the checker catches it: ignore-lease (Go workers ignore lease loss) or unsafe-revoke (revoke grants the lock again at once)")
	fs.StringVar(&c.Out, "out", "", "directory for report.json and history.jsonl (default: a new temp dir)")
	fs.BoolVar(&c.Keep, "keep", false, "keep the cluster's data dirs and logs")
	fs.StringVar(&c.Backend, "backend", backendLockd, "lockd; or redis (one redis-server, no persistence), redis-aof (appendfsync always) or redlock (3 redis-servers): violations are then the measurement and exit 0 unless --strict")
	faults := fs.String("faults", "", faultsUsage())
	fs.BoolVar(&c.Strict, "strict", false, "exit 1 on violations on a Redis backend too")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *faults != "" {
		c.Faults = strings.Split(*faults, ",")
	}
	if err := c.checkFaults(); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.Profile != "short" && c.Profile != "long":
		return nil, fmt.Errorf("--profile %q: want short or long", c.Profile)
	case c.Nodes != 3 && c.Nodes != 5:
		return nil, fmt.Errorf("--nodes %d: want 3 or 5", c.Nodes)
	case c.Clients < 2 || c.Clients > 64:
		return nil, fmt.Errorf("--clients %d: want 2 to 64", c.Clients)
	case c.Pairs < 0 || c.Pairs > 8:
		return nil, fmt.Errorf("--pairs %d: want 0 to 8", c.Pairs)
	case c.Locks < 1 || c.Locks > 64:
		return nil, fmt.Errorf("--locks %d: want 1 to 64", c.Locks)
	case c.Broken != brokenNone && c.Broken != brokenIgnoreLease && c.Broken != brokenUnsafeRevoke:
		return nil, fmt.Errorf("--broken %q: want ignore-lease or unsafe-revoke", c.Broken)
	case c.Backend != backendLockd && !isRedis(c.Backend):
		return nil, fmt.Errorf("--backend %q: want lockd, redis, redis-aof or redlock", c.Backend)
	case c.Broken != brokenNone && c.Backend != backendLockd:
		return nil, fmt.Errorf("--broken needs --backend lockd")
	case c.Duration < 0 || c.Duration > 24*time.Hour:
		return nil, fmt.Errorf("--duration %v: want up to 24h", c.Duration)
	}
	if c.Profile == "long" && c.Duration == 0 {
		c.Duration = 30 * time.Minute
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	return c, nil
}

// faultsUsage is the help of --faults: it lists the kinds from the tables
// checkFaults accepts (allFaults, redisFaults), so the two cannot drift.
func faultsUsage() string {
	redis := slices.Compact(slices.Clone(redisFaults))
	return "comma-separated fault kinds to inject instead of the profile's (the short profile injects each listed once).\n" +
		"On lockd: " + strings.Join(allFaults, ", ") + " (" + faultPartBridge + " with --nodes 5 only).\n" +
		"On redis, redis-aof, redlock: " + strings.Join(redis, ", ")
}

// checkFaults refuses a --faults kind the backend has no use for.
func (c *config) checkFaults() error {
	valid := allFaults
	if isRedis(c.Backend) {
		valid = slices.Clone(redisFaults)
	}
	for _, k := range c.Faults {
		if !slices.Contains(valid, k) || k == faultPartBridge && c.Nodes != 5 {
			return fmt.Errorf("--faults: %q is not a fault kind of backend %s with %d nodes", k, c.Backend, c.Nodes)
		}
	}
	return nil
}

// summary is the one-line result.
func summary(r *Report) string {
	faults := 0
	for _, n := range r.Faults {
		faults += n
	}
	backend := r.Backend
	if backend == "" {
		backend = backendLockd
	}
	verdict := "PASS"
	switch {
	case len(r.Errors) > 0:
		verdict = "FAIL"
	case len(r.Violations) > 0 && isRedis(backend):
		verdict = "UNSAFE" // the measured outcome on Redis, not a tool failure
	case len(r.Violations) > 0:
		verdict = "FAIL"
	}
	gap := ""
	if r.Faults[faultPauseLeader] > 0 {
		// The longest stretch without a grant around a leader pause: what
		// a frozen leader costs the clients.
		gap = fmt.Sprintf(" leader-pause-gap=%dms", r.UnavailAlone[faultPauseLeader])
	}
	return fmt.Sprintf("chaos %s: seed=%d backend=%s profile=%s nodes=%d clients=%d faults=%d acquired=%d runs=%d unsafe=%d unfenced=%d fenced=%d shared=%d lost-acks=%d linearizable=%s missed-wakeups=%d sets=%d cycles=%d refused=%d excused=%d p50=%.1fms p99=%.1fms%s violations=%d history=%s",
		verdict, r.Seed, backend, r.Profile, r.Nodes, r.Clients, faults, r.Ops.Acquired, r.Ops.Runs, r.Overlaps.Unsafe, r.Overlaps.Unfenced, r.Overlaps.Fenced,
		r.Shared, r.LostAcks, r.Linear, r.Missed, r.Sets.Granted, r.Cycles.Rounds, r.Cycles.Refused, r.Cycles.Excused, r.Latency.P50, r.Latency.P99, gap, len(r.Violations), r.History)
}

// checkFile is `chaos check FILE`: the checker on a recorded history.
func checkFile(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ttl := fs.Duration("ttl", 2*time.Second, "the run's session TTL")
	election := fs.Duration("election", 500*time.Millisecond, "the run's election timeout (and grace)")
	unfenced := fs.Bool("unfenced", false, "the history is from a backend without tokens (redlock)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: chaos check [--ttl D] [--election D] [--unfenced] HISTORY")
		return exitUsage
	}
	events, err := readHistory(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return exitHarness
	}
	r := &Report{History: fs.Arg(0)}
	p := params(timing{Election: *election, Grace: *election, TTL: *ttl})
	p.Unfenced = *unfenced
	check(events, p, r)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(r)
	if len(r.Violations) > 0 {
		return exitViolation
	}
	return exitOK
}

// params derives the checker's bounds from the run's timing.
func params(t timing) checkParams {
	return checkParams{
		Slack:         500 * time.Millisecond,
		Liveness:      t.TTL + t.Grace + t.Election + 2*time.Second,
		LinearTimeout: time.Minute,
		RefuseBound:   4 * time.Second,
	}
}

// outDir returns the directory for the report and the history.
func outDir(c *config) (string, error) {
	if c.Out != "" {
		return c.Out, os.MkdirAll(c.Out, 0o755)
	}
	return os.MkdirTemp("", fmt.Sprintf("lockd-chaos-%d-", c.Seed))
}

func writeReport(dir string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644)
}
