package main

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Hold is one set a worker held: written by the worker, one JSON line each.
type Hold struct {
	Worker  int               `json:"worker"`
	Session string            `json:"session"`
	N       int               `json:"n"`      // the worker's count of sets, from 0
	Names   []string          `json:"names"`  // in the order asked for
	Tokens  map[string]uint64 `json:"tokens"` // by name, as Lock returned them
	Acq     int64             `json:"acq"`    // wall time (Unix ns) after Lock returned
	Rel     int64             `json:"rel"`    // wall time just before Unlock
	WaitNS  int64             `json:"wait_ns"`
}

// WorkerEnd is a worker's last line: its tallies and the span it ran.
type WorkerEnd struct {
	Worker   int   `json:"worker"`
	End      bool  `json:"end"`
	Sets     int   `json:"sets"`
	Timeouts int   `json:"timeouts"`
	Errors   int   `json:"errors"`
	Start    int64 `json:"start"`
	Stop     int64 `json:"stop"`
}

// Grant is one GRANTED event the watcher saw.
type Grant struct {
	Name    string `json:"name"`
	Session string `json:"session"`
	Token   uint64 `json:"token"`
	Index   uint64 `json:"index"` // the Raft log index of the entry
}

// entryIndex reads the log index of an event position "INDEX.N@TAG".
func entryIndex(position string) (uint64, error) {
	i := strings.IndexByte(position, '.')
	if i < 0 {
		return 0, fmt.Errorf("position %q: no '.'", position)
	}
	return strconv.ParseUint(position[:i], 10, 64)
}

// checkEntry checks the grants of one log entry as they stream: every
// grant in this benchmark is of a set of minSet..maxSet locks, so each
// session's grants in one entry number minSet..maxSet. A set granted in
// part (some locks in one entry, the rest in another) shows as fewer.
func checkEntry(grants []Grant, minSet, maxSet int) []string {
	per := map[string][]string{}
	for _, g := range grants {
		per[g.Session] = append(per[g.Session], g.Name)
	}
	var bad []string
	for _, s := range sortedKeys(per) {
		if n := len(per[s]); n < minSet || n > maxSet {
			bad = append(bad, fmt.Sprintf("entry %d: session %s granted %d locks %v (want a set of %d-%d)",
				grants[0].Index, s, n, per[s], minSet, maxSet))
		}
	}
	return bad
}

// checkSets joins the workers' sets with the watched grants by (name,
// token): every lock of a set must have been granted to the set's session
// in one entry. With complete false (the watch was reset, events were
// lost) a set whose grants were not all seen is counted, not a violation.
func checkSets(holds []Hold, grants []Grant, complete bool) (unseen int, bad []string) {
	type key struct {
		name  string
		token uint64
	}
	byTok := map[key]Grant{}
	for _, g := range grants {
		byTok[key{g.Name, g.Token}] = g
	}
	for _, h := range holds {
		idx := map[uint64][]string{}
		missing := 0
		for _, n := range h.Names {
			g, ok := byTok[key{n, h.Tokens[n]}]
			if !ok {
				missing++
				continue
			}
			if g.Session != h.Session {
				bad = append(bad, fmt.Sprintf("worker %d set %d: %s token %d was granted to session %s, not %s",
					h.Worker, h.N, n, h.Tokens[n], g.Session, h.Session))
			}
			idx[g.Index] = append(idx[g.Index], n)
		}
		if len(idx) > 1 {
			bad = append(bad, fmt.Sprintf("worker %d set %d %v: granted in %d entries %v (a partial hold)",
				h.Worker, h.N, h.Names, len(idx), idx))
		}
		if missing > 0 {
			if complete {
				bad = append(bad, fmt.Sprintf("worker %d set %d %v: %d grants not in the watch, which had no reset",
					h.Worker, h.N, h.Names, missing))
			}
			unseen++
		}
	}
	return unseen, bad
}

// checkHolds checks the workers' records: every set has a token for each
// of its names and no other; per name, ordered by acquisition time, tokens
// strictly increase and no hold starts before the previous one ended.
func checkHolds(holds []Hold) []string {
	type iv struct {
		acq, rel int64
		token    uint64
		who      string
	}
	per := map[string][]iv{}
	var bad []string
	for _, h := range holds {
		who := fmt.Sprintf("worker %d set %d", h.Worker, h.N)
		if len(h.Tokens) != len(h.Names) {
			bad = append(bad, fmt.Sprintf("%s %v: %d tokens %v", who, h.Names, len(h.Tokens), h.Tokens))
		}
		if h.Rel < h.Acq {
			bad = append(bad, fmt.Sprintf("%s: released before acquired", who))
		}
		for _, n := range h.Names {
			t, ok := h.Tokens[n]
			if !ok || t == 0 {
				bad = append(bad, fmt.Sprintf("%s %v: no token for %s (a partial hold)", who, h.Names, n))
				continue
			}
			per[n] = append(per[n], iv{h.Acq, h.Rel, t, who})
		}
	}
	for _, n := range sortedKeys(per) {
		l := per[n]
		sort.Slice(l, func(i, j int) bool { return l[i].acq < l[j].acq })
		for i := 1; i < len(l); i++ {
			a, b := l[i-1], l[i]
			if b.token <= a.token {
				bad = append(bad, fmt.Sprintf("%s: token %d (%s) acquired after token %d (%s)", n, b.token, b.who, a.token, a.who))
			}
			if b.acq <= a.rel {
				bad = append(bad, fmt.Sprintf("%s: %s held token %d from %s while %s held token %d until %s",
					n, b.who, b.token, ts(b.acq), a.who, a.token, ts(a.rel)))
			}
		}
	}
	return bad
}

// Summary is what the checker prints.
type Summary struct {
	Sets, Timeouts, Errors, Unseen int
	Seconds                        float64
	P50, P99                       time.Duration
}

func summarize(holds []Hold, ends []WorkerEnd) Summary {
	var s Summary
	var start, stop int64
	for i, e := range ends {
		s.Timeouts += e.Timeouts
		s.Errors += e.Errors
		if i == 0 || e.Start < start {
			start = e.Start
		}
		stop = max(stop, e.Stop)
	}
	s.Sets = len(holds)
	s.Seconds = float64(stop-start) / 1e9
	waits := make([]int64, 0, len(holds))
	for _, h := range holds {
		waits = append(waits, h.WaitNS)
	}
	slices.Sort(waits)
	q := func(p float64) time.Duration {
		if len(waits) == 0 {
			return 0
		}
		return time.Duration(waits[min(len(waits)-1, int(p*float64(len(waits))))])
	}
	s.P50, s.P99 = q(0.50), q(0.99)
	return s
}

func ts(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05.000000") }

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}
