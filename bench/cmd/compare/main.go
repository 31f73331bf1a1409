// Command compare drives Redis, etcd and ZooKeeper with the workloads of
// `lockd bench` (the same engine, internal/loadgen, and the same report),
// and turns a directory of reports into the tables of bench/RESULTS.md.
//
//	compare run --system redis|etcd|zookeeper --endpoints A[,B,C] [flags]
//	compare wait --system redis|etcd|zookeeper --endpoints A[,B,C] [--timeout 60s]
//	compare ports N
//	compare seconds DURATION
//	compare results DIR
//
// bench/run.sh runs it; see bench/README.md.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd/internal/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: compare run|wait|ports|seconds|results ARGS")
	}
	switch args[0] {
	case "run":
		return runBench(ctx, args[1:], stdout, stderr)
	case "wait":
		return waitReady(ctx, args[1:], stderr)
	case "ports":
		if len(args) != 2 {
			return errors.New("usage: compare ports N")
		}
		return freePorts(stdout, args[1])
	case "seconds":
		// run.sh's arithmetic on Go durations.
		if len(args) != 2 {
			return errors.New("usage: compare seconds DURATION")
		}
		d, err := time.ParseDuration(args[1])
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, int64(math.Ceil(d.Seconds())))
		return nil
	case "results":
		if len(args) != 2 {
			return errors.New("usage: compare results DIR")
		}
		return writeResults(stdout, args[1])
	}
	return fmt.Errorf("unknown command %q (want run, wait, ports, seconds or results)", args[0])
}

// clientModules name the client library of each system, for the report.
var clientModules = map[string]string{
	"redis":     "github.com/redis/go-redis/v9",
	"etcd":      "go.etcd.io/etcd/client/v3",
	"zookeeper": "github.com/go-zookeeper/zk",
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("compare run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadgen.Config
	system := fs.String("system", "", "redis, etcd or zookeeper")
	endpoints := fs.String("endpoints", "", "comma-separated host:port of the servers (redis: one)")
	fs.StringVar(&cfg.Workload, "workload", loadgen.Own, "workload: "+strings.Join(loadgen.Workloads, ", "))
	fs.IntVar(&cfg.Clients, "clients", 16, "workers, each with its own client and session")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of the measured window")
	fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "unmeasured warm-up before the window")
	fs.DurationVar(&cfg.TTL, "ttl", 10*time.Second, "session (etcd lease, ZooKeeper session, Redis key) TTL")
	fs.IntVar(&cfg.Sessions, "sessions", 1000, "sessions to create (workload sessions)")
	fs.Int64Var(&cfg.MaxOps, "max-ops", 10_000_000, "stop a worker after this many operations")
	fs.DurationVar(&cfg.OpTimeout, "timeout", 10*time.Second, "give up one call after this long (not ZooKeeper's, which take no context)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	cfg.Prefix = "bench/" + hex.EncodeToString(b)
	d, eps, err := newDriver(*system, *endpoints)
	if err != nil {
		return err
	}
	r, err := loadgen.Run(ctx, d, cfg)
	if err != nil {
		return err
	}
	r.Version = moduleVersion(clientModules[*system])
	r.Endpoints = eps
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return r.WriteTable(stdout)
}

// moduleVersion returns the version of a dependency built in, "" if none.
func moduleVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range bi.Deps {
		if m.Path == path {
			return m.Path + " " + m.Version
		}
	}
	return ""
}

// newDriver returns the driver of system for comma-separated endpoints.
func newDriver(system, endpoints string) (loadgen.Driver, []string, error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, nil, errors.New("--endpoints: none given")
	}
	switch system {
	case "redis":
		if len(eps) != 1 {
			return nil, nil, errors.New("--endpoints: redis takes one server")
		}
		return &redisDriver{addr: eps[0]}, eps, nil
	case "etcd":
		return &etcdDriver{endpoints: eps}, eps, nil
	case "zookeeper":
		return &zkDriver{servers: eps}, eps, nil
	}
	return nil, nil, fmt.Errorf("--system %q: want redis, etcd or zookeeper", system)
}

// waitReady retries opening a client and a session until one works: the
// servers are up and, for a cluster, have a quorum.
func waitReady(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("compare wait", flag.ContinueOnError)
	fs.SetOutput(stderr)
	system := fs.String("system", "", "redis, etcd or zookeeper")
	endpoints := fs.String("endpoints", "", "comma-separated host:port of the servers")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	d, _, err := newDriver(*system, *endpoints)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := tryOnce(ctx, d)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s at %s not ready after %v: %w", *system, *endpoints, *timeout, err)
		case <-tick.C:
		}
	}
}

func tryOnce(ctx context.Context, d loadgen.Driver) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cl, err := d.NewClient(ctx)
	if err != nil {
		return err
	}
	defer cl.Close(context.WithoutCancel(ctx))
	s, err := cl.NewSession(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	return s.Close(ctx)
}

// freePorts prints n free TCP ports on 127.0.0.1, one a line. They are
// free when asked; the script starts its servers at once.
func freePorts(w io.Writer, arg string) error {
	n, err := strconv.Atoi(arg)
	if err != nil || n < 1 || n > 100 {
		return fmt.Errorf("ports %q: want 1 to 100", arg)
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		ls = append(ls, l)
		fmt.Fprintln(w, l.Addr().(*net.TCPAddr).Port)
	}
	return nil
}
