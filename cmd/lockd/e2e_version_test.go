package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// gateBaseCommit is the last commit without the version gate: its lockd
// applies command version 1 and reports no version.
const gateBaseCommit = "07ea3e2"

// skipOrFail skips the test with msg, or fails it under CI=true.
func skipOrFail(t *testing.T, msg string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(msg, args...)
	}
	t.Skipf(msg, args...)
}

// buildMixedBinaries builds the lockd of gateBaseCommit (from a git
// archive of this checkout) and this tree's lockd.
func buildMixedBinaries(t *testing.T) (oldBin, newBin string) {
	t.Helper()
	oldBin = buildOldLockd(t)
	newBin = filepath.Join(filepath.Dir(oldBin), "lockd-new")
	if b, err := exec.Command("go", "build", "-trimpath", "-o", newBin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build lockd: %v\n%s", err, b)
	}
	return oldBin, newBin
}

// buildOldLockd builds the lockd of gateBaseCommit from a git archive of
// this checkout. -trimpath keeps the build cache's keys free of the
// temporary source directory, so a second run links from the cache.
func buildOldLockd(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		skipOrFail(t, "go not found: %v", err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		skipOrFail(t, "git not found: %v", err)
	}
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		skipOrFail(t, "not in a git checkout: %v", err)
	}
	root := strings.TrimSpace(string(out))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", gateBaseCommit+"^{commit}").Run(); err != nil {
		skipOrFail(t, "commit %s not in this checkout (shallow clone?): %v", gateBaseCommit, err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	arch := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, gateBaseCommit, src)
	if b, err := arch.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", gateBaseCommit, err, b)
	}
	oldBin := filepath.Join(dir, "lockd-old")
	start := time.Now()
	build := exec.Command("go", "build", "-trimpath", "-o", oldBin, "./cmd/lockd")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build lockd of %s: %v\n%s", gateBaseCommit, err, b)
	}
	t.Logf("built the lockd of %s in %v", gateBaseCommit, time.Since(start).Round(time.Millisecond))
	return oldBin
}

// nodeState is what must be equal on every replica: the token counter and
// the lock table, read from the node's own state (a stale read).
func nodeState(url string) (string, error) {
	st, err := nodeStatus(url)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := lockdv1connect.NewLockServiceClient(statusHTTP, url).ListLocks(ctx, connect.NewRequest(&lockdv1.ListLocksRequest{
		PageSize: 1000, Consistency: lockdv1.ReadConsistency_READ_CONSISTENCY_STALE}))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "applied=%d last_token=%d", st.GetAppliedIndex(), st.GetLastToken())
	for _, l := range resp.Msg.GetLocks() {
		fmt.Fprintf(&b, " %s:", l.GetName())
		for _, h := range l.GetHolders() {
			fmt.Fprintf(&b, "%s/%d", h.GetSessionId(), h.GetToken())
		}
	}
	return b.String(), nil
}

// waitSameState polls until every node reports the same state, and
// returns it.
func waitSameState(t *testing.T, nodes []*clusterNode) string {
	t.Helper()
	var states []string
	if !pollEvery(20*time.Second, 50*time.Millisecond, func() bool {
		states = states[:0]
		for _, n := range nodes {
			s, err := nodeState(n.url())
			if err != nil {
				states = append(states, n.id+": "+err.Error())
				return false
			}
			states = append(states, s)
		}
		for _, s := range states[1:] {
			if s != states[0] {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("replicas differ:\n%s", strings.Join(states, "\n"))
	}
	return states[0]
}

// TestMixedVersionUpgrade runs a cluster of one lockd from before the
// version gate (n1) and two of this tree (n2, n3): a version-2 command is
// refused with UPGRADE_REQUIRED naming n1, and the replicas agree; n1 is
// replaced by this tree's lockd on its data dir, the leader raises the
// cluster version to 2, the command is accepted, and the replicas agree.
// The version-2 command is a real one: an AcquireMany (all-or-nothing
// multi-lock), which a version-1 node cannot decode.
func TestMixedVersionUpgrade(t *testing.T) {
	needBinary(t)
	oldBin, newBin := buildMixedBinaries(t)
	dir := t.TempDir()
	var nodes []*clusterNode
	for i := range 3 {
		nodes = append(nodes, &clusterNode{id: fmt.Sprintf("n%d", i+1), data: filepath.Join(dir, fmt.Sprintf("n%d", i+1)), api: freePort(t), raft: freePort(t)})
	}
	// n1, the old one, bootstraps (a new node alone would raise the
	// cluster version at once, and n1 could then not join); n2 and n3 join.
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	n1.srv = startNodeBin(t, oldBin, n1.data, n1.api, n1.raft, "/readyz", "--node-id", n1.id)
	for _, n := range []*clusterNode{n2, n3} {
		n.srv = startNodeBin(t, newBin, n.data, n.api, n.raft, "/healthz", "--node-id", n.id, "--join", n1.url())
	}
	c := &testCluster{nodes: nodes}
	c.waitStable(t, nodes, 30*time.Second)
	// The old node does not gate: hand leadership to a new one.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if _, err := lockdv1connect.NewClusterServiceClient(statusHTTP, n1.url()).TransferLeadership(ctx, connect.NewRequest(&lockdv1.TransferLeadershipRequest{NodeId: n2.id})); err != nil {
		t.Fatalf("transfer leadership to n2: %v", err)
	}
	if leader := c.waitStable(t, nodes, 30*time.Second); leader != n2.id {
		t.Fatalf("leader %s after the transfer, want n2", leader)
	}

	cl, err := lockd.New(lockd.WithEndpoints(n2.url(), n3.url(), n1.url()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	sess, err := cl.NewSession(ctx, lockd.WithTTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	old := sess.NewMutex("v1/a")
	for range 3 {
		if err := old.Lock(ctx); err != nil {
			t.Fatalf("version-1 lock on the mixed cluster: %v", err)
		}
		if err := old.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	v2 := sess.NewMultiLock([]string{"v2/a", "v2/b"})
	var refusal error
	if !pollEvery(15*time.Second, 100*time.Millisecond, func() bool {
		refusal = v2.TryLock(ctx)
		return errors.Is(refusal, lockd.ErrUpgradeRequired) && strings.Contains(refusal.Error(), "n1 (version 1)")
	}) {
		t.Fatalf("AcquireMany with n1 old: %v, want ErrUpgradeRequired naming n1 (version 1)", refusal)
	}
	t.Logf("refused: %v", refusal)
	before := waitSameState(t, nodes)
	if strings.Contains(before, "v2/a") {
		t.Fatalf("a refused lock is in the state: %s", before)
	}

	// Replace n1 by this tree's lockd on the same data dir.
	if err := n1.srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n1.srv.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("old n1 still running 15s after SIGTERM")
	}
	n1.srv = startNodeBin(t, newBin, n1.data, n1.api, n1.raft, "/healthz", "--node-id", n1.id)
	if !pollEvery(30*time.Second, 100*time.Millisecond, func() bool {
		for _, n := range nodes {
			st, err := nodeStatus(n.url())
			if err != nil || st.GetClusterVersion() != 2 || st.GetApplyVersion() != 2 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("cluster version not 2 on every node 30s after n1 was upgraded")
	}
	if err := v2.TryLock(ctx); err != nil {
		t.Fatalf("AcquireMany after the upgrade: %v", err)
	}
	after := waitSameState(t, nodes)
	if !strings.Contains(after, "v2/a:") || !strings.Contains(after, "v2/b:") {
		t.Fatalf("the accepted lock is not in the state: %s", after)
	}
	t.Logf("state on every node: %s", after)
}
