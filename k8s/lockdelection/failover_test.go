package lockdelection_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/k8s/internal/proc"
)

// leading is a candidate's "started leading" line.
type leading struct {
	Event string `json:"event"`
	ID    string `json:"id"`
	Token uint64 `json:"token"`
	T     int64  `json:"t"`
}

type candidate struct {
	id  string
	cmd *exec.Cmd
}

// TestFailoverKill9 runs candidates as processes (client-go's
// leaderelection.RunOrDie with the lockd lock) against a real 3-node lockd,
// kills the leading candidate with SIGKILL ten times, and measures the time
// from the kill to the next candidate's OnStartedLeading. It checks from
// lockd's own history (watch events) that no two candidates ever held the
// leadership at once, and that every candidate that led held a token lockd
// granted to it, in increasing order.
func TestFailoverKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts lockd and candidate processes")
	}
	lockdBin := proc.Build(t, "repo", "./cmd/lockd")
	candBin := proc.Build(t, "k8s", "./cmd/lockd-candidate")
	nodes := proc.Cluster(t, lockdBin, 3)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL())
	}
	const name = "k8s/failover-test"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// lockd's history of the election, from before the first campaign.
	wc, err := lockd.New(lockd.WithEndpoints(urls...))
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close(context.Background())
	var (
		histMu sync.Mutex
		hist   []lockd.Event
	)
	watchStarted := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ev, err := range wc.Watch(ctx, name, lockd.WatchState()) {
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("watch: %v", err)
				}
				return
			}
			if ev.Kind == lockd.EventSynced {
				close(watchStarted)
				continue
			}
			histMu.Lock()
			hist = append(hist, ev)
			histMu.Unlock()
		}
	}()
	select {
	case <-watchStarted:
	case <-time.After(30 * time.Second):
		t.Fatal("watch did not sync in 30s")
	}

	events := make(chan leading, 64)
	cands := map[string]*candidate{}
	start := func(id string) {
		cmd := exec.Command(candBin, "-endpoints", strings.Join(urls, ","), "-name", name, "-id", id, "-ttl", "1s")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		logf, err := os.Create(t.TempDir() + "/" + id + ".log")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cands[id] = &candidate{id: id, cmd: cmd}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var l leading
				if json.Unmarshal(sc.Bytes(), &l) == nil && l.Event == "leading" {
					events <- l
				}
			}
		}()
	}
	next := 0
	spawn := func() { start(fmt.Sprintf("cand-%d", next)); next++ }
	for range 3 {
		spawn()
	}
	waitLeader := func(why string) leading {
		select {
		case l := <-events:
			return l
		case <-time.After(60 * time.Second):
			t.Fatalf("no leader within 60s %s", why)
			return leading{}
		}
	}
	var led []leading
	cur := waitLeader("at start")
	led = append(led, cur)
	const kills = 10
	var failovers []time.Duration
	for i := range kills {
		c := cands[cur.ID]
		killed := time.Now()
		if err := c.cmd.Process.Kill(); err != nil { // SIGKILL: no resign, no session close
			t.Fatal(err)
		}
		_ = c.cmd.Wait()
		delete(cands, cur.ID)
		spawn() // keep three candidates
		nl := waitLeader(fmt.Sprintf("after kill %d of %s", i+1, cur.ID))
		if nl.ID == cur.ID {
			t.Fatalf("killed candidate %s reported leading again", cur.ID)
		}
		d := time.Unix(0, nl.T).Sub(killed)
		failovers = append(failovers, d)
		t.Logf("kill %d: %s killed, %s leads after %v (token %d)", i+1, cur.ID, nl.ID, d.Round(time.Millisecond), nl.Token)
		led = append(led, nl)
		cur = nl
	}
	// Let the watch deliver the last grant before stopping it.
	for deadline := time.Now().Add(30 * time.Second); ; {
		histMu.Lock()
		seen := slices.ContainsFunc(hist, func(ev lockd.Event) bool { return ev.Kind == lockd.EventGranted && ev.Token == cur.Token })
		histMu.Unlock()
		if seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch did not report the grant of token %d within 30s", cur.Token)
		}
		time.Sleep(50 * time.Millisecond) // polling a real cluster's stream, bounded by the deadline
	}
	cancel()
	<-watchDone

	sorted := slices.Clone(failovers)
	slices.Sort(sorted)
	p50, maxd := sorted[len(sorted)/2], sorted[len(sorted)-1]
	fmt.Printf("lockd leader-election failover after kill -9 (session TTL 1s, %d kills): p50 %v max %v all %v\n",
		kills, p50.Round(time.Millisecond), maxd.Round(time.Millisecond), roundAll(failovers))
	// The acceptance bound: the next leader starts in under 2 s (typical
	// case); a single slow one on a loaded machine gets a generous bound.
	if p50 >= 2*time.Second {
		t.Errorf("failover p50 %v, want under 2s", p50)
	}
	if maxd >= 10*time.Second {
		t.Errorf("failover max %v, want under 10s", maxd)
	}

	histMu.Lock()
	defer histMu.Unlock()
	checkHistory(t, hist, led)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// checkHistory checks lockd's events for the election: a grant only while
// nobody holds, tokens increasing, and each candidate that reported leading
// holding a token lockd granted to it.
func checkHistory(t *testing.T, hist []lockd.Event, led []leading) {
	t.Helper()
	var holder, last uint64
	owner := map[uint64]string{}
	for _, ev := range hist {
		switch ev.Kind {
		case lockd.EventHeld, lockd.EventGranted:
			if holder != 0 {
				t.Fatalf("history: %s granted token %d to %s while token %d (%s) still held: two leaders", ev.Position, ev.Token, ev.Owner, holder, owner[holder])
			}
			if ev.Token <= last {
				t.Fatalf("history: token %d granted after %d", ev.Token, last)
			}
			holder, last = ev.Token, ev.Token
			owner[ev.Token] = ev.Owner
		case lockd.EventReleased, lockd.EventExpired, lockd.EventForceReleased:
			if ev.Token != holder {
				t.Fatalf("history: %v of token %d, but %d holds", ev.Kind, ev.Token, holder)
			}
			holder = 0
		}
	}
	if len(owner) < len(led) {
		t.Fatalf("history has %d grants, candidates reported %d leaderships", len(owner), len(led))
	}
	var prev uint64
	for _, l := range led {
		if owner[l.Token] != l.ID {
			t.Errorf("%s reported leading with token %d, lockd granted it to %q", l.ID, l.Token, owner[l.Token])
		}
		if l.Token <= prev {
			t.Errorf("%s led with token %d after token %d", l.ID, l.Token, prev)
		}
		prev = l.Token
	}
	t.Logf("history: %d grants, %d events, no overlap", len(owner), len(hist))
}
