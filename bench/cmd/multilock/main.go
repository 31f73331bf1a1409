// Command multilock is the multi-lock soak of bench/multilock.sh, in
// three roles, each its own process:
//
//	multilock worker --endpoints E --id N --out FILE [--duration 60s] [--locks 5]
//	                 [--prefix bench/set-] [--timeout 5s] [--max-hold 2ms] [--seed S]
//	multilock watch  --endpoints E --out FILE [--ready FILE] [--prefix bench/set-] [--limit 10m]
//	multilock check  --watch FILE WORKER-FILE...
//
// A worker loops for --duration on one session: it picks 2 or 3 of the
// --locks names PREFIX0.. in random order, takes them with one MultiLock
// (Lock bounded by --timeout; a timeout is counted), holds them for a
// random 0..--max-hold, and writes one JSON line per set (names, tokens,
// wall time after Lock returned and just before Unlock, the wait), then a
// last line with its tallies.
//
// The watcher follows the GRANTED events under the prefix (Client.Watch)
// and checks, entry by entry, that every session's grants in one log entry
// number 2 or 3 (a set granted in part would show fewer). On SIGTERM (or
// --limit) it takes the lock PREFIX"end" and reads on until it sees that
// grant, so it has every earlier grant; it writes the grants and its
// findings to --out.
//
// The checker joins both: each set's locks were granted to its session in
// one entry; per name, tokens strictly increase with acquisition time and
// no two holds overlap; every set has a token for each of its names. It
// prints the sets, sets/s, p50/p99 of the wait in Lock, the timeouts and
// the violations, and exits 1 if there is any.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: multilock worker|watch|check ...")
		os.Exit(64)
	}
	var err error
	switch os.Args[1] {
	case "worker":
		err = worker(ctx, os.Args[2:])
	case "watch":
		err = watch(ctx, os.Args[2:])
	case "check":
		err = check(os.Args[2:], os.Stdout)
	default:
		err = fmt.Errorf("unknown role %q (worker, watch, check)", os.Args[1])
	}
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "multilock %s: %v\n", os.Args[1], err)
		}
		os.Exit(1)
	}
}

// WatchEnd is the watcher's last line.
type WatchEnd struct {
	End     bool     `json:"end"`
	Events  int      `json:"events"`
	Entries int      `json:"entries"` // entries with a grant
	Resets  int      `json:"resets"`
	Marker  bool     `json:"marker"` // it saw its own end marker
	Bad     []string `json:"bad"`
}

func check(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	watchFile := fs.String("watch", "", "the watcher's file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *watchFile == "" || fs.NArg() == 0 {
		return errors.New("want --watch FILE and the workers' files")
	}
	var (
		holds  []Hold
		ends   []WorkerEnd
		grants []Grant
		wend   *WatchEnd
		bad    []string
	)
	for _, f := range fs.Args() {
		var end *WorkerEnd
		err := readLines(f, func(line []byte) error {
			var e WorkerEnd
			if err := json.Unmarshal(line, &e); err != nil {
				return err
			}
			if e.End {
				end = &e
				return nil
			}
			var h Hold
			if err := json.Unmarshal(line, &h); err != nil {
				return err
			}
			holds = append(holds, h)
			return nil
		})
		if err != nil {
			return err
		}
		if end == nil {
			bad = append(bad, f+": no end line (the worker did not finish)")
			continue
		}
		ends = append(ends, *end)
	}
	err := readLines(*watchFile, func(line []byte) error {
		var e WatchEnd
		if err := json.Unmarshal(line, &e); err != nil {
			return err
		}
		if e.End {
			wend = &e
			return nil
		}
		var g Grant
		if err := json.Unmarshal(line, &g); err != nil {
			return err
		}
		grants = append(grants, g)
		return nil
	})
	if err != nil {
		return err
	}
	complete := false
	if wend == nil {
		bad = append(bad, *watchFile+": no end line (the watcher did not finish)")
	} else {
		bad = append(bad, wend.Bad...)
		complete = wend.Resets == 0 && wend.Marker
	}
	bad = append(bad, checkHolds(holds)...)
	unseen, sb := checkSets(holds, grants, complete)
	bad = append(bad, sb...)
	s := summarize(holds, ends)
	rate := 0.0
	if s.Seconds > 0 {
		rate = float64(s.Sets) / s.Seconds
	}
	fmt.Fprintf(out, "workers %d, %.1f s: sets granted %d (%.1f sets/s), acquire p50 %.2f ms p99 %.2f ms, timeouts %d, errors %d\n",
		len(ends), s.Seconds, s.Sets, rate, ms(s.P50.Nanoseconds()), ms(s.P99.Nanoseconds()), s.Timeouts, s.Errors)
	if wend != nil {
		fmt.Fprintf(out, "watch: %d grant events in %d entries, resets %d, end marker seen %v; sets joined to their entry %d, unseen %d\n",
			wend.Events, wend.Entries, wend.Resets, wend.Marker, s.Sets-unseen, unseen)
	}
	fmt.Fprintf(out, "violations=%d\n", len(bad))
	for i, b := range bad {
		if i == 20 {
			fmt.Fprintf(out, "  ... and %d more\n", len(bad)-20)
			break
		}
		fmt.Fprintln(out, "  "+b)
	}
	if len(bad) > 0 || s.Errors > 0 {
		return fmt.Errorf("%d violations, %d errors", len(bad), s.Errors)
	}
	return nil
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func readLines(path string, f func([]byte) error) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if err := f(sc.Bytes()); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	return sc.Err()
}
