package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/lockd-dev/lockd"
)

func endpoints(s string) []string {
	var eps []string
	for _, e := range strings.Split(s, ",") {
		if e != "" {
			eps = append(eps, e)
		}
	}
	return eps
}

func worker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	eps := fs.String("endpoints", "", "lockd API endpoints, comma-separated")
	id := fs.Int("id", 0, "this worker's number")
	outPath := fs.String("out", "", "file for the records")
	duration := fs.Duration("duration", 60*time.Second, "how long to loop")
	nlocks := fs.Int("locks", 5, "names to pick from: PREFIX0 ..")
	prefix := fs.String("prefix", "bench/set-", "lock name prefix")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on one Lock (a timeout is counted)")
	maxHold := fs.Duration("max-hold", 2*time.Millisecond, "hold each set a random 0..this")
	maxSets := fs.Int("max-sets", 1_000_000, "stop after this many sets")
	seed := fs.Uint64("seed", 1, "random seed (the worker's id is added)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *eps == "" || *outPath == "" || *nlocks < 3 {
		return errors.New("want --endpoints, --out and --locks >= 3")
	}
	f, w, enc, cl, err := openRole(*eps, *outPath)
	if err != nil {
		return err
	}
	defer f.Close()
	defer cl.Close(context.Background())
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := cl.NewSession(sctx, lockd.WithOwner(fmt.Sprintf("multilock-%d", *id)))
	cancel()
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(cctx)
	}()
	rng := rand.New(rand.NewPCG(*seed, uint64(*id)))
	end := WorkerEnd{Worker: *id, End: true, Start: time.Now().UnixNano()}
	deadline := time.Now().Add(*duration)
	for n := 0; n < *maxSets && time.Now().Before(deadline) && ctx.Err() == nil; n++ {
		k := 2 + rng.IntN(2)
		perm := rng.Perm(*nlocks)[:k]
		names := make([]string, k)
		for i, p := range perm {
			names[i] = fmt.Sprintf("%s%d", *prefix, p)
		}
		m := s.NewMultiLock(names)
		lctx, cancel := context.WithTimeout(ctx, *timeout)
		t0 := time.Now()
		err := m.Lock(lctx)
		wait := time.Since(t0)
		timedOut := lctx.Err() != nil
		cancel()
		if err != nil {
			// Whatever error the ended call gives, it is the timeout's.
			if timedOut && ctx.Err() == nil {
				end.Timeouts++
				continue
			}
			if ctx.Err() != nil {
				break
			}
			end.Errors++
			fmt.Fprintf(os.Stderr, "multilock worker %d: lock %v: %v\n", *id, names, err)
			if s.Err() != nil {
				break
			}
			continue
		}
		h := Hold{Worker: *id, Session: s.ID(), N: end.Sets, Names: names, Tokens: m.Tokens(), Acq: time.Now().UnixNano(), WaitNS: wait.Nanoseconds()}
		if *maxHold > 0 {
			// The hold itself is the workload: the set stays taken meanwhile.
			time.Sleep(rand.N(*maxHold))
		}
		h.Rel = time.Now().UnixNano()
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = m.Unlock(uctx)
		cancel()
		if err != nil {
			end.Errors++
			fmt.Fprintf(os.Stderr, "multilock worker %d: unlock %v: %v\n", *id, names, err)
		}
		end.Sets++
		if err := enc.Encode(h); err != nil {
			return err
		}
	}
	end.Stop = time.Now().UnixNano()
	if err := enc.Encode(end); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Sync()
}

func watch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	eps := fs.String("endpoints", "", "lockd API endpoints, comma-separated")
	outPath := fs.String("out", "", "file for the grants and findings")
	ready := fs.String("ready", "", "create this file once the watch is in place")
	prefix := fs.String("prefix", "bench/set-", "lock name prefix")
	limit := fs.Duration("limit", 10*time.Minute, "stop by itself after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *eps == "" || *outPath == "" {
		return errors.New("want --endpoints and --out")
	}
	f, w, enc, cl, err := openRole(*eps, *outPath)
	if err != nil {
		return err
	}
	defer f.Close()
	defer cl.Close(context.Background())

	// stop: SIGTERM or --limit; then the marker, then wctx ends once its
	// grant is seen (or 60 s later).
	stop, cancelStop := context.WithTimeout(ctx, *limit)
	defer cancelStop()
	wctx, cancelW := context.WithCancel(context.Background())
	defer cancelW()
	marker := *prefix + "end"
	markerErr := make(chan error, 1)
	go func() {
		<-stop.Done()
		// The watch gives up 60 s on, whatever the marker does.
		time.AfterFunc(60*time.Second, cancelW)
		mctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s, err := cl.NewSession(mctx, lockd.WithOwner("multilock-watch"))
		if err == nil {
			err = s.NewMutex(marker).Lock(mctx)
		}
		markerErr <- err
	}()

	var (
		res   WatchEnd
		entry []Grant
		cur   uint64
	)
	res.End = true
	flush := func() {
		if len(entry) > 0 {
			res.Entries++
			res.Bad = append(res.Bad, checkEntry(entry, 2, 3)...)
		}
		entry = entry[:0]
	}
	for ev, err := range cl.Watch(wctx, *prefix, lockd.WatchState()) {
		if errors.Is(err, lockd.ErrWatchReset) {
			res.Resets++
			flush()
			continue
		}
		if err != nil {
			if wctx.Err() == nil {
				return err
			}
			break
		}
		switch ev.Kind {
		case lockd.EventSynced:
			if *ready != "" {
				if err := os.WriteFile(*ready, nil, 0o644); err != nil {
					return err
				}
			}
			continue
		case lockd.EventGranted:
		default:
			if ev.EntryEnd {
				flush()
			}
			continue
		}
		idx, err := entryIndex(ev.Position)
		if err != nil {
			return err
		}
		if ev.Name == marker {
			flush()
			res.Marker = true
			cancelW()
			break
		}
		if idx != cur {
			flush()
			cur = idx
		}
		g := Grant{Name: ev.Name, Session: ev.Session, Token: ev.Token, Index: idx}
		entry = append(entry, g)
		res.Events++
		if err := enc.Encode(g); err != nil {
			return err
		}
		if ev.EntryEnd {
			flush()
		}
	}
	flush()
	if !res.Marker {
		res.Bad = append(res.Bad, fmt.Sprintf("the watch ended before the end marker's grant (marker: %v)", <-markerErr))
	}
	if err := enc.Encode(res); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Sync()
}

// openRole creates a role's output file (buffered, JSON lines) and its
// client of the endpoints eps.
func openRole(eps, outPath string) (*os.File, *bufio.Writer, *json.Encoder, *lockd.Client, error) {
	f, err := os.Create(outPath)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cl, err := lockd.New(lockd.WithEndpoints(endpoints(eps)...))
	if err != nil {
		f.Close()
		return nil, nil, nil, nil, err
	}
	w := bufio.NewWriter(f)
	return f, w, json.NewEncoder(w), cl, nil
}
