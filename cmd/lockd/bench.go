package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/loadgen"
)

// BenchCommand is `lockd bench`: a load generator to point at a cluster,
// like redis-benchmark or etcdctl check perf. Every worker is its own
// client with its own connections and session, as separate copies of an
// application are; the engine (internal/loadgen) is the one the comparison
// harness under bench/ runs against Redis, etcd and ZooKeeper.
type BenchCommand struct {
	env commandEnv
}

const benchUsage = `Usage: lockd bench [flags]

Load a lockd cluster and report throughput, latency percentiles, errors,
connections opened and the client's CPU. Each of --clients workers has its
own client (own connections) and session. Workloads:

  own       each worker takes and releases its own lock: acquire+release
            pairs per second, latency of the pair
  one       every worker takes and releases one lock: grants (handoffs)
            per second, fairness = fewest grants of a worker / most,
            latency = wait for the grant
  handoff   every worker contends on one lock; latency from the holder's
            release call to the waiting worker's grant
  sessions  --sessions sessions created over the clients and kept alive
            for the run: creation rate and latency, creation errors,
            sessions lost; the CPU line is the keepalives' cost after
            the warm-up (measure the server's CPU and memory with your own
            tools meanwhile)
  listlocks --locks locks held from a few sessions, then --rounds rounds
            of three phases of --warmup + --duration each, the order
            rotating by round: --readers workers call ListLocks{page_size:
            --page-size} at --reader-rate calls/s each on the held locks'
            prefix; the same on a prefix that matches nothing; no readers.
            Meanwhile one good client takes and releases its own lock.
            Reports the good client's pair latency in each phase and the
            p99 ratio of the first two (--clients is not used)

The window measured starts after --warmup and lasts --duration. Errors are
counted over the whole run; calls cut short by its end are not errors.
Connections are counted by the dialer of each client's HTTP transport
(a copy of the client's default one). The exit status is 0 when the run
completed, whatever its errors (read them from the report).

Example:

  lockd bench --endpoints 10.0.0.1:7070,10.0.0.2:7070 --workload own --clients 16 --duration 30s

Flags:
`

// benchOptions are the parsed flags.
type benchOptions struct {
	cf     *clientFlags
	cfg    loadgen.Config
	list   listOptions
	asJSON bool
	// cpuProfile names the file of a CPU profile of this process over the
	// workload (warm-up and window), for bench/cpubudget.sh.
	cpuProfile string
}

func (c *BenchCommand) parse(args []string) (*benchOptions, error) {
	fs := newFlagSet("bench", c.env.stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), benchUsage)
		fs.PrintDefaults()
	}
	o := &benchOptions{cf: &clientFlags{}}
	o.cf.register(fs, c.env.getenv)
	fs.StringVar(&o.cfg.Workload, "workload", loadgen.Own, "workload: "+strings.Join(loadgen.Workloads, ", ")+", "+listWorkload)
	fs.IntVar(&o.cfg.Clients, "clients", 16, "workers, each with its own client and session")
	fs.DurationVar(&o.cfg.Duration, "duration", 10*time.Second, "length of the measured window")
	fs.DurationVar(&o.cfg.Warmup, "warmup", 2*time.Second, "unmeasured warm-up before the window")
	fs.DurationVar(&o.cfg.TTL, "ttl", 10*time.Second, "sessions' lease TTL")
	fs.IntVar(&o.cfg.Sessions, "sessions", 1000, "sessions to create (workload sessions)")
	fs.Int64Var(&o.cfg.MaxOps, "max-ops", 10_000_000, "stop a worker after this many operations")
	fs.DurationVar(&o.cfg.OpTimeout, "timeout", 10*time.Second, "give up one call (acquire, release, session creation) after this long")
	fs.StringVar(&o.cfg.Prefix, "prefix", "", "start lock names with this (default bench/ and a random id, so runs never share a lock)")
	fs.IntVar(&o.list.locks, "locks", 100_000, "locks to hold (workload listlocks)")
	fs.IntVar(&o.list.readers, "readers", 4, "ListLocks workers, each with its own client (workload listlocks)")
	fs.Float64Var(&o.list.readerRate, "reader-rate", 190, "ListLocks calls per second per reader, one in flight (workload listlocks)")
	fs.IntVar(&o.list.pageSize, "page-size", 1, "ListLocks page_size (workload listlocks)")
	fs.IntVar(&o.list.rounds, "rounds", 3, "rounds of a matching and an empty phase (workload listlocks)")
	fs.BoolVar(&o.asJSON, "json", false, "print the report as JSON")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process over the warm-up and window to this file (default: none)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(pos, 0, 0, "lockd bench [flags]"); err != nil {
		return nil, err
	}
	if o.cfg.Prefix == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		o.cfg.Prefix = "bench/" + hex.EncodeToString(b)
	}
	if o.cfg.Workload == listWorkload {
		l := &o.list
		l.phase, l.warmup, l.ttl, l.timeout, l.prefix, l.maxOps = o.cfg.Duration, o.cfg.Warmup, o.cfg.TTL, o.cfg.OpTimeout, o.cfg.Prefix, o.cfg.MaxOps
		if err := l.validate(); err != nil {
			return nil, usageError{err}
		}
		return o, nil
	}
	if err := o.cfg.Validate(); err != nil {
		return nil, usageError{err}
	}
	return o, nil
}

// Run runs the workload and prints its report.
func (c *BenchCommand) Run(ctx context.Context, args []string) error {
	o, err := c.parse(args)
	if err != nil {
		return err
	}
	eps := splitEndpoints(o.cf.endpoints)
	d := newBenchDriver(eps, o.cf.stream)
	if o.cf.tlsOn() {
		if d.tls, err = o.cf.tlsConfig(); err != nil {
			return err
		}
		for i, e := range eps {
			if eps[i], err = endpoint.NormalizeScheme(e, "https"); err != nil {
				return usageError{fmt.Errorf("--endpoints: %w", err)}
			}
		}
	}
	// A bad endpoint is a usage error before any load starts.
	probe, err := d.newLockdClient()
	if err != nil {
		return err
	}
	_ = probe.Close(ctx)
	if o.cfg.Workload == listWorkload {
		r, err := runList(ctx, d, &o.list, c.env.stderr)
		if err != nil {
			return callError("bench", err)
		}
		r.Version, r.Endpoints = version, eps
		return writeList(c.env.stdout, r, o.asJSON)
	}
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	r, err := loadgen.Run(ctx, d, o.cfg)
	if perr := stopProfile(); err == nil && perr != nil {
		return perr
	}
	if err != nil {
		return callError("bench", err)
	}
	r.Version = version
	r.Endpoints = eps
	if o.asJSON {
		enc := json.NewEncoder(c.env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return r.WriteTable(c.env.stdout)
}

// startCPUProfile starts a CPU profile into the file named path (none if
// path is empty); the function it returns stops it and closes the file.
func startCPUProfile(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		return nil
	}, nil
}
