package main

import (
	"strings"
	"testing"
)

// history: three sets of worker 1 and 2 on bench/set-0..2, well behaved.
func history() ([]Hold, []Grant) {
	holds := []Hold{
		{Worker: 1, Session: "s1", N: 0, Names: []string{"b", "a"}, Tokens: map[string]uint64{"a": 10, "b": 20}, Acq: 100, Rel: 200},
		{Worker: 2, Session: "s2", N: 0, Names: []string{"a", "c", "b"}, Tokens: map[string]uint64{"a": 11, "b": 21, "c": 30}, Acq: 300, Rel: 400},
		{Worker: 1, Session: "s1", N: 1, Names: []string{"c", "a"}, Tokens: map[string]uint64{"a": 12, "c": 31}, Acq: 500, Rel: 600},
	}
	grants := []Grant{
		{Name: "b", Session: "s1", Token: 20, Index: 7}, {Name: "a", Session: "s1", Token: 10, Index: 7},
		{Name: "a", Session: "s2", Token: 11, Index: 9}, {Name: "c", Session: "s2", Token: 30, Index: 9}, {Name: "b", Session: "s2", Token: 21, Index: 9},
		{Name: "c", Session: "s1", Token: 31, Index: 12}, {Name: "a", Session: "s1", Token: 12, Index: 12},
	}
	return holds, grants
}

func wantBad(t *testing.T, bad []string, substr string) {
	t.Helper()
	for _, b := range bad {
		if strings.Contains(b, substr) {
			return
		}
	}
	t.Fatalf("no violation containing %q in %q", substr, bad)
}

func TestCheckGoodHistory(t *testing.T) {
	holds, grants := history()
	if bad := checkHolds(holds); len(bad) > 0 {
		t.Fatalf("checkHolds: %q", bad)
	}
	if unseen, bad := checkSets(holds, grants, true); len(bad) > 0 || unseen != 0 {
		t.Fatalf("checkSets: unseen %d, %q", unseen, bad)
	}
	for _, idx := range []uint64{7, 9, 12} {
		var e []Grant
		for _, g := range grants {
			if g.Index == idx {
				e = append(e, g)
			}
		}
		if bad := checkEntry(e, 2, 3); len(bad) > 0 {
			t.Fatalf("checkEntry %d: %q", idx, bad)
		}
	}
}

func TestCheckOverlap(t *testing.T) {
	holds, _ := history()
	holds[1].Acq = 150 // worker 2 takes a while worker 1 holds it until 200
	wantBad(t, checkHolds(holds), "a: worker 2 set 0 held token 11")
}

func TestCheckTokenOrder(t *testing.T) {
	holds, _ := history()
	holds[2].Tokens["a"] = 11 // not above the previous holder's 11
	wantBad(t, checkHolds(holds), "a: token 11 (worker 1 set 1) acquired after token 11")
}

func TestCheckMissingName(t *testing.T) {
	holds, _ := history()
	delete(holds[1].Tokens, "c")
	bad := checkHolds(holds)
	wantBad(t, bad, "no token for c (a partial hold)")
	wantBad(t, bad, "2 tokens")
}

func TestCheckPartialSetAcrossEntries(t *testing.T) {
	holds, grants := history()
	grants[4].Index = 10 // s2's b granted one entry after its a and c
	_, bad := checkSets(holds, grants, true)
	wantBad(t, bad, "worker 2 set 0 [a c b]: granted in 2 entries")
	// As the watcher sees it, entry by entry: s2 got 2 locks at 9 (a set
	// size, so not caught there) and 1 at 10.
	wantBad(t, checkEntry(grants[4:5], 2, 3), "entry 10: session s2 granted 1 locks [b]")
}

func TestCheckGrantToAnotherSession(t *testing.T) {
	holds, grants := history()
	grants[0].Session = "s2"
	_, bad := checkSets(holds, grants, true)
	wantBad(t, bad, "b token 20 was granted to session s2, not s1")
	wantBad(t, checkEntry(grants[:2], 2, 3), "session s2 granted 1 locks")
}

func TestCheckUnseenGrants(t *testing.T) {
	holds, grants := history()
	grants = grants[:5] // the last set's grants are not in the watch
	if _, bad := checkSets(holds, grants, true); len(bad) == 0 {
		t.Fatal("a complete watch without the last set's grants passed")
	}
	if unseen, bad := checkSets(holds, grants, false); len(bad) > 0 || unseen != 1 {
		t.Fatalf("after a reset: unseen %d (want 1), %q", unseen, bad)
	}
}

func TestEntryIndex(t *testing.T) {
	if i, err := entryIndex("4711.2@5f0c2a8e9b1d4c7f"); err != nil || i != 4711 {
		t.Fatalf("entryIndex: %d, %v", i, err)
	}
	if _, err := entryIndex("4711"); err == nil {
		t.Fatal("entryIndex of a position without '.' passed")
	}
}

func TestSummarize(t *testing.T) {
	holds, _ := history()
	holds[0].WaitNS, holds[1].WaitNS, holds[2].WaitNS = 3e6, 1e6, 2e6
	s := summarize(holds, []WorkerEnd{{Start: 0, Stop: 2e9, Timeouts: 1}, {Start: 1e9, Stop: 3e9, Timeouts: 2}})
	if s.Sets != 3 || s.Timeouts != 3 || s.Seconds != 3 || s.P50.Milliseconds() != 2 || s.P99.Milliseconds() != 3 {
		t.Fatalf("summarize: %+v", s)
	}
}
