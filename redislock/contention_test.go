package redislock_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd/internal/sectionlog"
	"github.com/lockd-dev/lockd/redislock"
)

// workerEnv carries a workerConfig (JSON) to a re-executed test binary.
const workerEnv = "REDISLOCK_TEST_WORKER"

func isWorker() bool { return os.Getenv(workerEnv) != "" }

// workerConfig is one process's share of TestContention.
type workerConfig struct {
	Proc       string   // process label in the log
	Addrs      []string // one: single instance; more: Redlock nodes
	Log        string   // the shared critical-section log
	Goroutines int
	Iterations int
}

const (
	contentionProcs      = 3
	contentionGoroutines = 32
)

// TestContention (acceptance 1): 32 goroutines in each of 3 processes take
// one lock over and over, on a single instance and on Redlock over 3 and 5
// nodes. Every critical section appends a begin and an end line to one
// shared O_APPEND log; the checker then proves that no two critical
// sections overlapped (every begin is followed by its own end) and, on a
// single instance, that tokens strictly increase in grant order.
func TestContention(t *testing.T) {
	if isWorker() {
		t.Skip("worker process")
	}
	for _, tc := range []struct {
		name  string
		nodes int
		iters int
	}{
		{"single", 1, 8},
		{"redlock3", 3, 3},
		{"redlock5", 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvs := servers(t, tc.nodes)
			cfg := workerConfig{
				Log:        filepath.Join(t.TempDir(), "critical.log"),
				Goroutines: contentionGoroutines,
				Iterations: tc.iters,
			}
			for _, s := range srvs {
				cfg.Addrs = append(cfg.Addrs, s.Addr())
			}
			type child struct {
				cmd *exec.Cmd
				out bytes.Buffer
			}
			var children []*child
			for p := 1; p < contentionProcs; p++ {
				cfg := cfg
				cfg.Proc = "p" + strconv.Itoa(p)
				b, _ := json.Marshal(cfg)
				c := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestContentionWorker$", "-test.count=1", "-test.v")}
				c.cmd.Env = append(os.Environ(), workerEnv+"="+string(b))
				c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
				if err := c.cmd.Start(); err != nil {
					t.Fatal(err)
				}
				children = append(children, c)
			}
			cfg.Proc = "p0"
			start := time.Now()
			if err := runWorker(cfg); err != nil {
				t.Errorf("in-process worker: %v", err)
			}
			for _, c := range children {
				if err := c.cmd.Wait(); err != nil {
					t.Errorf("worker process: %v\n%s", err, c.out.String())
				}
			}
			n := checkLog(t, cfg.Log, tc.nodes == 1)
			if want := contentionProcs * contentionGoroutines * tc.iters; n != want {
				t.Errorf("critical sections in the log: got %d, want %d", n, want)
			}
			t.Logf("%d critical sections by %d processes × %d goroutines in %v", n, contentionProcs, contentionGoroutines, time.Since(start))
		})
	}
}

// TestContentionWorker is the body of a worker process of TestContention.
func TestContentionWorker(t *testing.T) {
	if !isWorker() {
		t.Skip("runs only as a worker process of TestContention")
	}
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := runWorker(cfg); err != nil {
		t.Fatal(err)
	}
}

// runWorker runs cfg.Goroutines goroutines, each taking the lock
// cfg.Iterations times through its own handle.
func runWorker(cfg workerConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log, err := os.OpenFile(cfg.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	var rdbs []redis.UniversalClient
	for _, a := range cfg.Addrs {
		rdb := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, PoolSize: cfg.Goroutines + 4})
		defer rdb.Close()
		rdbs = append(rdbs, rdb)
	}
	var newMutex func() *redislock.Mutex
	if len(rdbs) == 1 {
		c, err := redislock.New(ctx, rdbs[0], redislock.WithTTL(5*time.Second))
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		newMutex = func() *redislock.Mutex { return c.NewMutex("contended") }
	} else {
		// A generous per-node timeout: three processes with -race share
		// two cores with the Redis servers.
		r, err := redislock.NewRedlock(ctx, rdbs, redislock.WithTTL(5*time.Second), redislock.WithRequestTimeout(time.Second))
		if err != nil {
			return err
		}
		defer r.Close(context.Background())
		newMutex = func() *redislock.Mutex { return r.NewMutex("contended") }
	}
	var wg sync.WaitGroup
	errs := make([]error, cfg.Goroutines)
	for g := range cfg.Goroutines {
		wg.Go(func() {
			m := newMutex()
			id := fmt.Sprintf("%s/%d", cfg.Proc, g)
			for range cfg.Iterations {
				if err := m.Lock(ctx); err != nil {
					errs[g] = fmt.Errorf("%s: lock: %w", id, err)
					return
				}
				tok := strconv.FormatUint(m.Token(), 10)
				_, err1 := log.WriteString("B " + id + " " + tok + "\n")
				_, err2 := log.WriteString("E " + id + " " + tok + "\n")
				lost := m.Err()
				if err := errors.Join(err1, err2, lost, m.Unlock(ctx)); err != nil {
					errs[g] = fmt.Errorf("%s: critical section: %w", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// checkLog reads the critical-section log ("B ID TOKEN" / "E ID TOKEN") and
// fails t on an overlap or, with tokens, on a token not above the one before.
// It returns the number of critical sections.
func checkLog(t *testing.T, path string, tokens bool) int {
	t.Helper()
	f := sectionlog.Format{Begin: "B", End: "E", Fields: 3}
	if tokens {
		f.Token = 2
	}
	n, err := sectionlog.Check(path, f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
