package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/lockd-dev/lockd"
)

// defaultTiming is the cluster and client timing of a run: short, so a
// pause longer than the TTL takes seconds, yet long enough for a loaded
// two-core machine not to flap leaders on its own.
//
// The watchdog limit is shorter than the server's default (10 s), so that
// node-disk-hang takes seconds, yet longer than any other fault stalls a
// leader's proposals: a leader SIGSTOPped for TTL + grace + 1 s (3.5 s)
// finds its proposals that old when it resumes, and must not exit for it.
var defaultTiming = timing{Election: 500 * time.Millisecond, Grace: 500 * time.Millisecond, TTL: 2 * time.Second, Watchdog: 6 * time.Second}

// run is one chaos run: cluster, clients, faults, check. It returns the
// report (nil if the harness could not start) and a harness error.
func run(ctx context.Context, cfg *config, stderr io.Writer) (*Report, error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s chaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	logf("seed %d (replay with --seed %d), profile %s, %d nodes, %d clients", cfg.Seed, cfg.Seed, cfg.Profile, cfg.Nodes, cfg.Clients)
	out, err := outDir(cfg)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "lockd-chaos-work-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if !cfg.Keep {
			_ = os.RemoveAll(work)
		}
	}()
	bin, err := buildBinary(ctx, work)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	t := defaultTiming
	reg := newRegister()
	reg.unfenced = cfg.Backend == backendRedlock
	regURL, err := reg.start()
	if err != nil {
		return nil, err
	}
	defer reg.stop()
	tg, err := newTarget(ctx, cfg, bin, work, t)
	if tg != nil {
		defer tg.down()
	}
	if err != nil {
		return nil, err
	}
	start := time.Now()
	logf("%s up; data and logs in %s", tg.describe(), work)

	// Clients: half Go workers, half lockd run loops. The hard end bounds
	// them even if the tool is stuck; normally they are stopped earlier.
	var locks []string
	for i := range cfg.Locks {
		locks = append(locks, fmt.Sprintf("chaos/%c", 'a'+i))
	}
	hardEnd := time.Now().Add(max(cfg.Duration, 5*time.Minute) + 2*time.Minute)
	sr := &slotRunner{self: self, lockd: bin, register: regURL, locks: locks,
		ttl: t.TTL, until: hardEnd, seed: cfg.Seed, broken: cfg.Broken, logDir: work, backend: cfg.Backend}
	if tg.rf != nil {
		sr.endpoints, sr.redisURLs = tg.rf.addrs(), tg.rf.urls()
	} else {
		sr.endpoints = tg.c.endpoints()
	}
	var slots []*slot
	for i := range cfg.Clients {
		s := &slot{name: fmt.Sprintf("w%d", i), kind: "go"}
		if i%2 == 1 {
			s = &slot{name: fmt.Sprintf("r%d", i), kind: "run"}
		}
		slots = append(slots, s)
	}
	// On lockd, the Go workers also take sets (the contended names and two
	// only sets use), and the pair slots invert lock orders on names of
	// their own; the liveness probe takes every one of these names too.
	probed := locks
	if tg.rf == nil {
		sr.setLocks = append(clone(locks), "chaos/set-0", "chaos/set-1")
		probed = clone(sr.setLocks)
		for i := range cfg.Pairs {
			s := &slot{name: fmt.Sprintf("p%d", cfg.Clients+i), kind: "pair"}
			slots = append(slots, s)
			probed = append(probed, pairLocks(s.name)...)
		}
	}
	cctx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Go(func() { sr.loop(cctx, s, i) })
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		stopClients()
		for _, s := range slots {
			s.signal(syscall.SIGCONT) // a pause cut short by an interrupt
			if s.kind == "go" || s.kind == "pair" {
				s.signal(syscall.SIGTERM)
			}
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			logf("clients still running 40s after stop: killing them")
			for _, s := range slots {
				s.signal(syscall.SIGCONT)
				s.signal(syscall.SIGKILL)
			}
			<-done
		}
	}
	defer stop()

	// Faults.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6e656d65))
	nem := &nemesis{c: tg.c, rf: tg.rf, t: t, reg: reg, slots: slots, rng: rng, broken: cfg.Broken, log: logf}
	p := params(t)
	p.Unfenced = reg.unfenced
	var harness []string
	sleep(ctx, 4*time.Second) // warm-up: grants before the first fault
	plan := schedule(cfg, rng)
	runStart := time.Now()
	for i := 0; ctx.Err() == nil; i++ {
		var kind string
		switch {
		case i < len(plan):
			kind = plan[i]
		case cfg.Profile == "long" && time.Since(runStart) < cfg.Duration:
			kinds := faultsFor(cfg)
			kind = kinds[rng.IntN(len(kinds))]
		}
		if kind == "" {
			break
		}
		logf("fault %d: %s", i+1, kind)
		ok, err := nem.inject(ctx, kind)
		if err != nil {
			harness = append(harness, fmt.Sprintf("%s: %v", kind, err))
			logf("fault %s: %v", kind, err)
			if errors.Is(err, context.Canceled) {
				break
			}
		} else if !ok {
			logf("fault %s: nothing to inject it into", kind)
		}
		sleep(ctx, time.Second+time.Duration(rng.IntN(2000))*time.Millisecond)
		if err := tg.waitStable(ctx, 30*time.Second); err != nil {
			harness = append(harness, fmt.Sprintf("after %s: %v", kind, err))
		}
	}
	// Quiet: every fault healed; waiters must be served within the bound.
	quiet := p.Liveness + 2*time.Second
	if rest := cfg.Duration - time.Since(runStart); rest > quiet {
		quiet = rest
	}
	logf("last fault healed; %v without faults", quiet.Round(time.Second))
	sleep(ctx, quiet)
	stop()
	if ctx.Err() != nil {
		harness = append(harness, fmt.Sprintf("interrupted: %v", context.Cause(ctx)))
	}
	var probe error
	if ctx.Err() == nil {
		probe = tg.probe(ctx, probed, p.Liveness+t.TTL)
	}
	// A client that panicked or, built with -race, raced is a harness
	// failure: its data dir and logs are kept for a look.
	for _, s := range slots {
		b, _ := os.ReadFile(filepath.Join(work, s.name+".log"))
		if bytes.Contains(b, []byte("DATA RACE")) || bytes.Contains(b, []byte("panic:")) {
			harness = append(harness, fmt.Sprintf("client %s crashed or raced: see %s", s.name, filepath.Join(work, s.name+".log")))
			cfg.Keep = true
		}
	}

	events := reg.close()
	r := &Report{Seed: cfg.Seed, Backend: cfg.Backend, Profile: cfg.Profile, Nodes: tg.nodes(), Clients: cfg.Clients, Broken: cfg.Broken,
		Duration: time.Since(start).Round(time.Second).String(), Errors: harness}
	r.History = filepath.Join(out, "history.jsonl")
	hf, err := os.Create(r.History)
	if err != nil {
		return nil, err
	}
	err = writeHistory(hf, events)
	if cerr := hf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	logf("checking %d events", len(events))
	check(events, p, r)
	if probe != nil {
		r.Violations = append(r.Violations, probe.Error())
	}
	if err := writeReport(out, r); err != nil {
		return r, err
	}
	logf("report %s", filepath.Join(out, "report.json"))
	if len(harness) > 0 {
		return r, fmt.Errorf("harness: %v", harness)
	}
	return r, nil
}

// schedule is the seeded order of the profile's planned faults: the short
// profile injects every kind once.
func schedule(cfg *config, rng *rand.Rand) []string {
	plan := faultsFor(cfg)
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	return plan
}

// probeLocks takes and releases every lock with a fresh session after the
// clients stopped: a lock still held or stuck past the bound is a
// liveness violation.
func probeLocks(ctx context.Context, c *cluster, locks []string, bound time.Duration) error {
	cl, err := lockd.New(lockd.WithEndpoints(c.endpoints()...), streamOption())
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	s, err := cl.NewSession(ctx, lockd.WithTTL(defaultTiming.TTL))
	if err != nil {
		return fmt.Errorf("liveness probe: %w", err)
	}
	defer s.Close(context.Background())
	for _, name := range locks {
		m := s.NewMutex(name)
		if err := m.Lock(ctx); err != nil {
			return fmt.Errorf("liveness probe: lock %q not granted within %v after the clients stopped: %w", name, bound, err)
		}
		if err := m.Unlock(ctx); err != nil {
			return fmt.Errorf("liveness probe: unlock %q: %w", name, err)
		}
	}
	return nil
}
