// Command compare drives Redis, etcd and ZooKeeper with the workloads of
// `lockd bench` (the same engine, internal/loadgen, and the same report),
// and turns a directory of reports into the tables of bench/RESULTS.md.
//
//	compare run --system redis|etcd|zookeeper --endpoints A[,B,C] [flags]
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
	"os"
	"os/signal"
	"runtime/debug"
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
		return errors.New("usage: compare run|results ...")
	}
	switch args[0] {
	case "run":
		return runBench(ctx, args[1:], stdout, stderr)
	case "results":
		if len(args) != 2 {
			return errors.New("usage: compare results DIR")
		}
		return writeResults(stdout, args[1])
	}
	return fmt.Errorf("unknown command %q (want run or results)", args[0])
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
	var eps []string
	for _, e := range strings.Split(*endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return errors.New("--endpoints: none given")
	}
	var d loadgen.Driver
	switch *system {
	case "redis":
		if len(eps) != 1 {
			return errors.New("--endpoints: redis takes one server")
		}
		d = &redisDriver{addr: eps[0]}
	case "etcd":
		d = &etcdDriver{endpoints: eps}
	case "zookeeper":
		d = &zkDriver{servers: eps}
	default:
		return fmt.Errorf("--system %q: want redis, etcd or zookeeper", *system)
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
