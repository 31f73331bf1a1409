package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// snapshotsIn counts the snapshots a node's data dir holds.
func snapshotsIn(dataDir string) int {
	entries, _ := os.ReadDir(filepath.Join(dataDir, "raft", "snapshots"))
	n := 0
	for _, e := range entries {
		if e.IsDir() && !slices.Contains([]string{".", ".."}, e.Name()) {
			n++
		}
	}
	return n
}

// TestClusterWipedMemberCatchesUpFromSnapshot: the
// cluster compacts its log into snapshots; a follower is killed, wiped and
// brought back under a new id. It can only catch up by installing the
// leader's snapshot (it snapshots nothing itself), and then serves the same
// holds with the same tokens.
func TestClusterWipedMemberCatchesUpFromSnapshot(t *testing.T) {
	// Small segments: the log is truncated by whole segment files, so a
	// compacted log is really gone and a new member needs the snapshot.
	c := startCluster(t, 3, "--snapshot-threshold", "16", "--trailing-logs", "4", "--snapshot-interval", "50ms", "--wal-segment-size", "4096")
	all := c.endpoints(0, 1, 2)

	// Holds to compare after the catch-up, then enough traffic to compact.
	var holders []*runProc
	for i := range 3 {
		holders = append(holders, startRunAt(t, all, "--ttl", "30s", fmt.Sprint("snap/hold/", i), "--", "sleep", "1000"))
	}
	for i := range 12 {
		if p := startRunAt(t, all, "--no-wait", fmt.Sprint("snap/churn/", i), "--", "true"); p.wait(t, 20*time.Second) != 0 {
			t.Fatalf("churn %d: %s", i, p.output())
		}
	}
	leader, _ := stable(c.nodes)
	if !poll(10*time.Second, func() bool { return snapshotsIn(c.node(leader).data) > 0 }) {
		t.Fatal("the leader never took a snapshot")
	}
	describe := func(endpoint, name string) describeJSON {
		t.Helper()
		var d describeJSON
		if !poll(10*time.Second, func() bool {
			out, _, code := lockdCLI(t, endpoint, "describe", "--stale", "--json", name)
			return code == 0 && json.Unmarshal([]byte(out), &d) == nil && d.Lock != nil && len(d.Lock.Holders) == 1
		}) {
			t.Fatalf("describe %s on %s: no holder", name, endpoint)
		}
		return d
	}
	var want []string
	for i := range holders {
		want = append(want, describe(all, fmt.Sprint("snap/hold/", i)).Lock.Holders[0].Token)
	}

	var victim *clusterNode
	for _, n := range c.nodes {
		if n.id != leader {
			victim = n
			break
		}
	}
	victim.kill(t)
	if err := os.RemoveAll(victim.data); err != nil {
		t.Fatal(err)
	}
	victim.id, victim.join = victim.id+"-b", all
	// Its own threshold is out of reach: a snapshot in its data dir can
	// only be the leader's, installed over Raft.
	victim.extra = []string{"--snapshot-threshold", "1000000", "--snapshot-interval", "1h", "--snapshot-log-bytes", "0"}
	start := time.Now()
	victim.start(t)
	c.waitStable(t, c.nodes, 30*time.Second)
	t.Logf("wiped member back as %s, a voter, in %v", victim.id, time.Since(start).Round(time.Millisecond))
	if n := snapshotsIn(victim.data); n == 0 {
		t.Fatal("the rejoined member has no snapshot: it did not catch up from one")
	}
	for i, tok := range want {
		got := describe(victim.url(), fmt.Sprint("snap/hold/", i)).Lock.Holders[0].Token
		if got != tok {
			t.Errorf("hold %d on the rejoined member: token %s, want %s", i, got, tok)
		}
	}
	for _, h := range holders {
		h.cmd.Process.Signal(os.Interrupt)
	}
}

type describeJSON struct {
	Lock *struct {
		Holders []struct {
			Token string `json:"token"`
		} `json:"holders"`
	} `json:"lock"`
}
